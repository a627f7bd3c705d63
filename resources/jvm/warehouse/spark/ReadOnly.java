package warehouse.spark;

import java.util.Locale;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.expressions.CallMethodViaReflection;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.PlanExpression;
import org.apache.spark.sql.catalyst.expressions.PythonFuncExpression;
import org.apache.spark.sql.catalyst.expressions.PythonUDAF;
import org.apache.spark.sql.catalyst.expressions.PythonUDTF;
import org.apache.spark.sql.catalyst.expressions.TryReflect;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.plans.logical.InsertIntoDir;
import org.apache.spark.sql.catalyst.plans.logical.InsertIntoStatement;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.ScriptTransformation;
import org.apache.spark.sql.execution.command.ResetCommand;
import org.apache.spark.sql.execution.command.SetCommand;

import scala.Option;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * What a read-only Spark (the analysts') refuses, and whether a session is one.
 *
 * <p>A session is read-only when its server was started with {@code spark.warehouse.readOnly=true} (a setting of
 * the server's own configuration, which no client can change: {@code SET} and Spark Connect's config requests
 * change a session's settings, never the server's), or when the session itself set it (a tool's guard on a
 * shared Spark, which it then cannot unset: {@code SET} and {@code RESET} of it are refused like any other).
 *
 * <p>Refused, by the analysed plan: every command but {@code SET} of {@link #SETTABLE} and those of
 * {@link #READ_ONLY_COMMANDS} ({@code SHOW}, {@code DESCRIBE}, {@code EXPLAIN}, {@code USE}; so every write, DDL, {@code CACHE}, {@code ADD JAR},
 * {@code CREATE FUNCTION}); reflection ({@code reflect}, {@code java_method}, {@code try_reflect}); Python code
 * (UDFs, UDTFs, {@code mapInPandas} and the other pandas/Arrow operators); {@code TRANSFORM … USING} scripts.
 * Reads by path are refused by {@link LakeCatalog}, and what Spark Connect lets a client do outside a plan by
 * {@link ReadOnlyInterceptor}.
 */
public final class ReadOnly {
  public static final String SETTING = "spark.warehouse.readOnly";
  /** How every refusal begins, here and in {@code warehouse sql}'s JVM-free engine. */
  public static final String PREFIX = "analysts' access is read-only: ";

  /** Session settings a read-only client may change: presentation, sizing and time zone, nothing that reaches
   * files, code, catalogs or security. */
  public static final Set<String> SETTABLE = Set.of(
      "spark.sql.session.timezone",
      "spark.sql.shuffle.partitions",
      "spark.sql.ansi.enabled",
      "spark.sql.adaptive.enabled",
      "spark.sql.execution.arrow.pyspark.enabled",
      "spark.sql.execution.arrow.maxrecordsperbatch",
      "spark.sql.execution.pandas.converttoarrowarraysafely",
      "spark.sql.repl.eagereval.enabled",
      "spark.sql.repl.eagereval.maxnumrows",
      "spark.sql.repl.eagereval.truncate",
      "spark.sql.pyspark.jvmstacktrace.enabled",
      "spark.sql.datetime.java8api.enabled",
      "spark.sql.timestamptype",
      "spark.sql.legacy.timeparserpolicy",
      // the lake a shared session's names point to: a read-only catalog ignores it (its lake is its server's)
      LakeCatalog.SESSION_LAKE.toLowerCase(Locale.ROOT));

  private static final Map<String, String> COMMANDS = Map.ofEntries(
      Map.entry("AddJarsCommand", "ADD JAR (loading code)"),
      Map.entry("AddFilesCommand", "ADD FILE (loading code)"),
      Map.entry("AddArchivesCommand", "ADD ARCHIVE (loading code)"),
      Map.entry("CreateFunctionCommand", "CREATE FUNCTION (loading code)"),
      Map.entry("CreateFunction", "CREATE FUNCTION (loading code)"),
      Map.entry("CreateUserDefinedFunction", "CREATE FUNCTION (loading code)"),
      Map.entry("CreateUserDefinedFunctionCommand", "CREATE FUNCTION (loading code)"),
      Map.entry("CacheTableCommand", "CACHE TABLE"),
      Map.entry("CacheTable", "CACHE TABLE"),
      Map.entry("CacheTableAsSelect", "CACHE TABLE"),
      Map.entry("InsertIntoDataSourceDirCommand", "INSERT OVERWRITE DIRECTORY (writing files)"),
      Map.entry("SaveIntoDataSourceCommand", "writing by path (DataFrameWriter.save)"),
      Map.entry("InsertIntoHadoopFsRelationCommand", "writing files (INSERT or DataFrameWriter)"),
      Map.entry("WriteIntoDeltaCommand", "writing a Delta table"),
      Map.entry("CreateTableAsSelect", "CREATE TABLE … AS SELECT"),
      Map.entry("ReplaceTableAsSelect", "REPLACE TABLE … AS SELECT"),
      Map.entry("CreateTable", "CREATE TABLE"),
      Map.entry("CreateDataSourceTableAsSelectCommand", "CREATE TABLE … AS SELECT"),
      Map.entry("CreateViewCommand", "CREATE VIEW"),
      Map.entry("CreateView", "CREATE VIEW"),
      Map.entry("CreateNamespace", "CREATE SCHEMA"),
      Map.entry("DropTable", "DROP TABLE"),
      Map.entry("DropTableCommand", "DROP TABLE"),
      Map.entry("DropNamespace", "DROP SCHEMA"),
      Map.entry("DropFunction", "DROP FUNCTION"),
      Map.entry("DeltaMergeInto", "MERGE"),
      Map.entry("MergeIntoTable", "MERGE"),
      Map.entry("MergeIntoCommand", "MERGE"),
      Map.entry("DeleteFromTable", "DELETE"),
      Map.entry("DeleteCommand", "DELETE"),
      Map.entry("UpdateTable", "UPDATE"),
      Map.entry("UpdateCommand", "UPDATE"),
      Map.entry("AppendData", "INSERT (writing a table)"),
      Map.entry("OverwriteByExpression", "INSERT OVERWRITE (writing a table)"),
      Map.entry("OverwritePartitionsDynamic", "INSERT OVERWRITE (writing a table)"),
      Map.entry("TruncateTable", "TRUNCATE"),
      Map.entry("LoadDataCommand", "LOAD DATA"),
      Map.entry("OptimizeTableCommand", "OPTIMIZE"),
      Map.entry("VacuumTableCommand", "VACUUM"),
      Map.entry("RestoreTableCommand", "RESTORE"),
      Map.entry("SaveAsV1TableCommand", "saveAsTable (creating a table)"),
      Map.entry("AddColumns", "ALTER TABLE"),
      Map.entry("DropColumns", "ALTER TABLE"),
      Map.entry("RenameColumn", "ALTER TABLE"),
      Map.entry("ReplaceColumns", "ALTER TABLE"),
      Map.entry("AlterColumns", "ALTER TABLE"),
      Map.entry("RenameTable", "ALTER TABLE"),
      Map.entry("SetTableProperties", "ALTER TABLE"),
      Map.entry("UnsetTableProperties", "ALTER TABLE"),
      Map.entry("SetTableLocation", "ALTER TABLE"));

  /** The commands that only read (SHOW, DESCRIBE, EXPLAIN) or change nothing but the session's current catalog and
   * database (USE), by class: every other command is refused, a command a later Spark or Delta adds included, until
   * it is decided here (tests/resources/test_read_only_commands.py lists every command class the jars ship). */
  public static final Set<String> READ_ONLY_COMMANDS = Set.of(
      "org.apache.spark.sql.catalyst.plans.logical.DescribeColumn",
      "org.apache.spark.sql.catalyst.plans.logical.DescribeFunction",
      "org.apache.spark.sql.catalyst.plans.logical.DescribeNamespace",
      "org.apache.spark.sql.catalyst.plans.logical.DescribeRelation",
      "org.apache.spark.sql.catalyst.plans.logical.DescribeTablePartition",
      "org.apache.spark.sql.catalyst.plans.logical.SetCatalogAndNamespace",
      "org.apache.spark.sql.catalyst.plans.logical.ShowColumns",
      "org.apache.spark.sql.catalyst.plans.logical.ShowCreateTable",
      "org.apache.spark.sql.catalyst.plans.logical.ShowFunctions",
      "org.apache.spark.sql.catalyst.plans.logical.ShowPartitions",
      "org.apache.spark.sql.catalyst.plans.logical.ShowTablePartition",
      "org.apache.spark.sql.catalyst.plans.logical.ShowTableProperties",
      "org.apache.spark.sql.catalyst.plans.logical.ShowTables",
      "org.apache.spark.sql.catalyst.plans.logical.ShowTablesExtended",
      "org.apache.spark.sql.catalyst.plans.logical.ShowViews",
      "org.apache.spark.sql.delta.commands.DescribeDeltaDetailCommand",
      "org.apache.spark.sql.delta.commands.DescribeDeltaHistoryCommand",
      "org.apache.spark.sql.delta.commands.ShowDeltaPartitionsCommand",
      "org.apache.spark.sql.delta.commands.ShowDeltaTableColumnsCommand",
      "org.apache.spark.sql.execution.command.DescribeColumnCommand",
      "org.apache.spark.sql.execution.command.DescribeDatabaseCommand",
      "org.apache.spark.sql.execution.command.DescribeFunctionCommand",
      "org.apache.spark.sql.execution.command.DescribeProcedureCommand",
      "org.apache.spark.sql.execution.command.DescribeQueryCommand",
      "org.apache.spark.sql.execution.command.DescribeRelationJsonCommand",
      "org.apache.spark.sql.execution.command.DescribeTableCommand",
      "org.apache.spark.sql.execution.command.ExplainCommand",
      "org.apache.spark.sql.execution.command.SetCatalogCommand",
      "org.apache.spark.sql.execution.command.SetNamespaceCommand",
      "org.apache.spark.sql.execution.command.ShowCatalogsCommand",
      "org.apache.spark.sql.execution.command.ShowCollationsCommand",
      "org.apache.spark.sql.execution.command.ShowColumnsCommand",
      "org.apache.spark.sql.execution.command.ShowCreateTableAsSerdeCommand",
      "org.apache.spark.sql.execution.command.ShowCreateTableCommand",
      "org.apache.spark.sql.execution.command.ShowCurrentNamespaceCommand",
      "org.apache.spark.sql.execution.command.ShowFunctionsCommand",
      "org.apache.spark.sql.execution.command.ShowNamespacesCommand",
      "org.apache.spark.sql.execution.command.ShowPartitionsCommand",
      "org.apache.spark.sql.execution.command.ShowProceduresCommand",
      "org.apache.spark.sql.execution.command.ShowTablePropertiesCommand",
      "org.apache.spark.sql.execution.command.ShowTablesCommand",
      "org.apache.spark.sql.execution.command.ShowViewsCommand");

  private ReadOnly() {}

  /** Whether ``session``'s server was started read-only (the analysts'). */
  public static boolean server(SparkSession session) {
    return session.sparkContext().conf().getBoolean(SETTING, false);
  }

  /** Whether ``session`` may only read: see the class comment. */
  public static boolean applies(SparkSession session) {
    if (server(session)) {
      return true;
    }
    return Boolean.parseBoolean(session.sessionState().conf().getConfString(SETTING, "false").strip());
  }

  /** The error for a refused request, naming what was refused. */
  public static SecurityException refused(String what) {
    return new SecurityException(PREFIX + what + " is not allowed");
  }

  public static boolean settable(String key) {
    return SETTABLE.contains(key.strip().toLowerCase(Locale.ROOT));
  }

  /** Throws {@link #refused} for the first thing in ``plan`` (its subqueries included) a read-only session may
   * not run. */
  public static void check(LogicalPlan plan) {
    String what = refusal(plan);
    if (what != null) {
      throw refused(what);
    }
  }

  /** What ``plan`` does that a read-only session may not, or null. */
  public static String refusal(LogicalPlan plan) {
    String own = refusalOfNode(plan);
    if (own != null) {
      return own;
    }
    for (Expression expression : CollectionConverters.asJava(plan.expressions())) {
      String found = refusalOfExpression(expression);
      if (found != null) {
        return found;
      }
    }
    for (LogicalPlan child : CollectionConverters.asJava(plan.children())) {
      String found = refusal(child);
      if (found != null) {
        return found;
      }
    }
    return null;
  }

  private static String refusalOfExpression(Expression expression) {
    if (expression instanceof TryReflect) {
      return "try_reflect (calling Java methods by reflection)";
    }
    if (expression instanceof CallMethodViaReflection) {
      return "reflect/java_method (calling Java methods by reflection)";
    }
    if (expression instanceof PythonFuncExpression python) {
      String kind = python instanceof PythonUDTF ? "UDTF" : python instanceof PythonUDAF ? "UDAF" : "UDF";
      return "a Python " + kind + " (" + python.name() + ": user code)";
    }
    if (expression instanceof PlanExpression<?> subquery && subquery.plan() instanceof LogicalPlan inner) {
      String found = refusal(inner);
      if (found != null) {
        return found;
      }
    }
    for (Expression child : CollectionConverters.asJava(expression.children())) {
      String found = refusalOfExpression(child);
      if (found != null) {
        return found;
      }
    }
    return null;
  }

  private static String refusalOfNode(LogicalPlan node) {
    String name = node.getClass().getSimpleName();
    if (node instanceof SetCommand set) {
      Option<Tuple2<String, Option<String>>> kv = set.kv();
      if (kv.isDefined() && kv.get()._2().isDefined() && !settable(kv.get()._1())) {
        return "SET " + kv.get()._1().strip();
      }
      return null;
    }
    if (node instanceof ResetCommand reset) {
      Option<String> key = reset.config();
      return key.isDefined() && settable(key.get()) ? null : "RESET" + (key.isDefined() ? " " + key.get() : "");
    }
    if (node instanceof ScriptTransformation) {
      return "TRANSFORM … USING (running an operating-system command)";
    }
    if (node instanceof InsertIntoDir) {
      return "INSERT OVERWRITE DIRECTORY (writing files)";
    }
    if (node instanceof InsertIntoStatement) {
      return "INSERT (writing a table)";
    }
    if (name.matches(".*(Pandas|Arrow|Python|InR).*")) {
      return "Python code (" + name + ", user code)";
    }
    if (node instanceof Command) {
      return commandRefusal(node.getClass());
    }
    return null;
  }

  /** What a read-only session says of a command of class ``command`` (SET and RESET aside, decided by their key):
   * null for one on {@link #READ_ONLY_COMMANDS}, else the refusal's words. */
  public static String commandRefusal(Class<?> command) {
    if (READ_ONLY_COMMANDS.contains(command.getName())) {
      return null;
    }
    String name = command.getSimpleName();
    return COMMANDS.getOrDefault(name, "the command " + name + " (it writes or changes the server)");
  }
}
