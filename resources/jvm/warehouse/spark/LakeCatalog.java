package warehouse.spark;

import java.io.IOException;
import java.util.Set;
import java.util.regex.Pattern;

import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableWritePrivilege;
import org.apache.spark.sql.delta.catalog.DeltaCatalog;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * Delta's session catalog that also knows the warehouse's tables by name: {@code layer.table} is the Delta table
 * at {@code <lake>/<layer>/<table>}, looked up when a query names it, so a table created after the session (or the
 * Spark Connect server) started is found like the others, and no registration can go stale.
 *
 * <p>Options ({@code spark.sql.catalog.spark_catalog.<option>}):
 * <ul>
 *   <li>{@code lake}: the lake root as Spark's file systems name it ({@code file:/...}, {@code s3a://...});
 *   <li>{@code confined}: {@code true} for a server analysts reach: the lake root cannot be changed by a session,
 *       path identifiers ({@code delta.`/path`}) are refused outside the lake, and tables cannot be written.
 * </ul>
 * Outside a confined catalog a session may point the names at another lake with the runtime setting
 * {@code spark.warehouse.lake} (the product's tools on a shared test session).
 *
 * <p>A name resolves only when both parts are lowercase identifiers ({@code [a-z][a-z0-9_]*}): no dots, slashes or
 * {@code ..} can reach a folder outside the lake, nor its hidden ({@code _}, {@code .}) folders.
 */
public class LakeCatalog extends DeltaCatalog {
  private static final Pattern NAME = Pattern.compile("[a-z][a-z0-9_]{0,127}");
  public static final String SESSION_LAKE = "spark.warehouse.lake";

  private String lake;
  private boolean confined;

  @Override
  public void initialize(String name, CaseInsensitiveStringMap options) {
    super.initialize(name, options);
    lake = trimmed(options.get("lake"));
    confined = Boolean.parseBoolean(options.getOrDefault("confined", "false"));
    if (confined && lake == null) {
      throw new IllegalArgumentException("a confined LakeCatalog needs its lake root (option `lake`)");
    }
  }

  private static String trimmed(String root) {
    if (root == null || root.isBlank()) {
      return null;
    }
    String value = root.strip();
    while (value.endsWith("/") && value.length() > 1) {
      value = value.substring(0, value.length() - 1);
    }
    return value;
  }

  private String lakeRoot() {
    if (!confined) {
      String own = trimmed(SparkSession.active().conf().get(SESSION_LAKE, ""));
      if (own != null) {
        return own;
      }
    }
    return lake;
  }

  /** The Delta path identifier of a warehouse table's name, or null when the name is not one in the lake. */
  private Identifier lakeTable(Identifier ident) {
    String root = lakeRoot();
    if (root == null || ident.namespace().length != 1) {
      return null;
    }
    String layer = ident.namespace()[0];
    String table = ident.name();
    if (!NAME.matcher(layer).matches() || !NAME.matcher(table).matches()) {
      return null;
    }
    Path location = new Path(root + "/" + layer + "/" + table);
    try {
      FileSystem fs = location.getFileSystem(SparkSession.active().sessionState().newHadoopConf());
      if (!fs.exists(new Path(location, "_delta_log"))) {
        return null;
      }
    } catch (IOException e) {
      throw new IllegalStateException("cannot look up " + layer + "." + table + " at " + location + ": " + e, e);
    }
    return Identifier.of(new String[] {"delta"}, location.toString());
  }

  /** The identifier to load: a lake table's path, or ``ident`` itself once a confined catalog allows it. */
  private Identifier resolve(Identifier ident) {
    Identifier found = lakeTable(ident);
    if (found != null) {
      return found;
    }
    if (confined && ident.namespace().length == 1 && isPathIdentifier(ident)) {
      Path path = new Path(ident.name());
      String uri = path.toUri().normalize().toString();
      String root = new Path(lake).toUri().normalize().toString();
      if (!(uri + "/").startsWith(root + "/") || uri.contains("/../")) {
        throw new SecurityException("only the warehouse's tables can be read here, by name (layer.table): "
            + ident.name() + " is outside the lake");
      }
    }
    return ident;
  }

  private void refuseWrites(Identifier ident) {
    if (confined) {
      throw new SecurityException("this Spark reads the warehouse only: " + String.join(".", ident.namespace())
          + "." + ident.name() + " cannot be written here");
    }
  }

  @Override
  public Table loadTable(Identifier ident) {
    return super.loadTable(resolve(ident));
  }

  @Override
  public Table loadTable(Identifier ident, Set<TableWritePrivilege> privileges)
      throws org.apache.spark.sql.catalyst.analysis.NoSuchTableException {
    if (privileges != null && !privileges.isEmpty()) {
      refuseWrites(ident);
    }
    return super.loadTable(resolve(ident), privileges);
  }

  @Override
  public Table loadTable(Identifier ident, long timestamp) {
    return super.loadTable(resolve(ident), timestamp);
  }

  @Override
  public Table loadTable(Identifier ident, String version) {
    return super.loadTable(resolve(ident), version);
  }

  @Override
  public boolean tableExists(Identifier ident) {
    return lakeTable(ident) != null || super.tableExists(ident);
  }
}
