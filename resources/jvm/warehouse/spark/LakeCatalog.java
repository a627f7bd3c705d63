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
 *       path identifiers ({@code delta.`/path`}, {@code parquet.`/path`}) are refused, and tables cannot be
 *       written. A read-only server ({@link ReadOnly}) is confined whatever this option says; a session that made
 *       itself read-only is refused paths and writes too, but keeps its own lake.
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

  // set while this catalog loads a lake table by the path it resolved the name to: Delta's catalog loads it again
  // through loadTable (time travel), which must not take the catalog's own path for a client's
  private static final ThreadLocal<Boolean> LOADING_BY_NAME = ThreadLocal.withInitial(() -> false);

  private String lake;
  private boolean confinedOption;

  @Override
  public void initialize(String name, CaseInsensitiveStringMap options) {
    super.initialize(name, options);
    lake = trimmed(options.get("lake"));
    confinedOption = Boolean.parseBoolean(options.getOrDefault("confined", "false"));
    if (confined() && lake == null) {
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

  /** The analysts' Spark: its own lake only, whatever a session sets. */
  private boolean confined() {
    return confinedOption || ReadOnly.server(SparkSession.active());
  }

  /** Confined, or a session that made itself read-only: nothing by path, no writes. */
  private boolean readOnly() {
    return confined() || ReadOnly.applies(SparkSession.active());
  }

  private String lakeRoot() {
    if (!confined()) {
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
    if (found != null || LOADING_BY_NAME.get()) {
      return found != null ? found : ident;
    }
    if (readOnly() && ident.namespace().length == 1 && (isPathIdentifier(ident) || ident.name().contains("/"))) {
      throw ReadOnly.refused("reading files by path (" + ident.namespace()[0] + ".`" + ident.name()
          + "`; name a lake table as layer.table)");
    }
    return ident;
  }

  /** ``load`` of the identifier ``ident`` resolves to, Delta's own nested loads of a lake table's path allowed. */
  private <T> T loading(Identifier ident, java.util.function.Function<Identifier, T> load) {
    Identifier target = resolve(ident);
    if (target == ident || LOADING_BY_NAME.get()) {
      return load.apply(target);
    }
    LOADING_BY_NAME.set(true);
    try {
      return load.apply(target);
    } finally {
      LOADING_BY_NAME.set(false);
    }
  }

  private void refuseWrites(Identifier ident) {
    if (readOnly()) {
      throw ReadOnly.refused("writing " + String.join(".", ident.namespace()) + "." + ident.name()
          + " (INSERT, MERGE, UPDATE, DELETE)");
    }
  }

  @Override
  public Table loadTable(Identifier ident) {
    return loading(ident, super::loadTable);
  }

  @Override
  public Table loadTable(Identifier ident, Set<TableWritePrivilege> privileges)
      throws org.apache.spark.sql.catalyst.analysis.NoSuchTableException {
    if (privileges != null && !privileges.isEmpty()) {
      refuseWrites(ident);
    }
    Identifier target = resolve(ident);
    if (target == ident) {
      return super.loadTable(target, privileges);
    }
    LOADING_BY_NAME.set(true);
    try {
      return super.loadTable(target, privileges);
    } finally {
      LOADING_BY_NAME.set(false);
    }
  }

  @Override
  public Table loadTable(Identifier ident, long timestamp) {
    return loading(ident, target -> super.loadTable(target, timestamp));
  }

  @Override
  public Table loadTable(Identifier ident, String version) {
    return loading(ident, target -> super.loadTable(target, version));
  }

  /** Delta's test for a path identifier, which a confined Spark's ``spark.sql.runSQLOnFiles=false`` turns off for
   * every path: on for the lake table this catalog is loading by its name, and that one only. */
  @Override
  public boolean isPathIdentifier(Identifier ident) {
    if (LOADING_BY_NAME.get() && ident.namespace().length == 1 && ident.namespace()[0].equals("delta")) {
      return new Path(ident.name()).isAbsolute();
    }
    return super.isPathIdentifier(ident);
  }

  @Override
  public boolean tableExists(Identifier ident) {
    return lakeTable(ident) != null || super.tableExists(ident);
  }
}
