package warehouse.spark;

import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.spark.connect.proto.AnalyzePlanRequest;
import org.apache.spark.connect.proto.Catalog;
import org.apache.spark.connect.proto.Command;
import org.apache.spark.connect.proto.CommonInlineUserDefinedFunction;
import org.apache.spark.connect.proto.ConfigRequest;
import org.apache.spark.connect.proto.ExecutePlanRequest;
import org.apache.spark.connect.proto.Expression;
import org.apache.spark.connect.proto.KeyValue;
import org.apache.spark.connect.proto.Read;
import org.apache.spark.connect.proto.SparkConnectServiceGrpc;
import org.sparkproject.connect.grpc.ForwardingServerCallListener;
import org.sparkproject.connect.grpc.Metadata;
import org.sparkproject.connect.grpc.ServerCall;
import org.sparkproject.connect.grpc.ServerCallHandler;
import org.sparkproject.connect.grpc.ServerInterceptor;
import org.sparkproject.connect.grpc.Status;
import org.sparkproject.connect.protobuf.Message;

/**
 * The read-only Spark Connect server's gate ({@code spark.connect.grpc.interceptor.classes}) for what a client can
 * do outside an analysed plan, where {@link ReadOnly}'s check never looks: upload code (artifacts), change a
 * session's settings by a config request, run commands that are no plan (streaming, ML, registering functions or
 * data sources, external commands, pipelines, checkpoints), cache, read files by path ({@code spark.read.load}),
 * or send Scala/Java functions, or call the Catalog API's calls that change the server ({@code cacheTable},
 * {@code clearCache}, {@code refreshTable}, {@code createTable} …: Spark serves most of them without a plan). Each
 * is refused with the same message as the check's; the request never reaches
 * Spark, and the server stays up.
 */
public final class ReadOnlyInterceptor implements ServerInterceptor {
  /** The service's calls a read-only client needs: run and analyse plans, settings, its session's upkeep. */
  private static final Set<String> CALLS = Set.of(
      SparkConnectServiceGrpc.getExecutePlanMethod().getFullMethodName(),
      SparkConnectServiceGrpc.getAnalyzePlanMethod().getFullMethodName(),
      SparkConnectServiceGrpc.getConfigMethod().getFullMethodName(),
      SparkConnectServiceGrpc.getArtifactStatusMethod().getFullMethodName(),
      SparkConnectServiceGrpc.getInterruptMethod().getFullMethodName(),
      SparkConnectServiceGrpc.getReattachExecuteMethod().getFullMethodName(),
      SparkConnectServiceGrpc.getReleaseExecuteMethod().getFullMethodName(),
      SparkConnectServiceGrpc.getReleaseSessionMethod().getFullMethodName(),
      SparkConnectServiceGrpc.getFetchErrorDetailsMethod().getFullMethodName(),
      SparkConnectServiceGrpc.getGetStatusMethod().getFullMethodName());

  /** Commands whose plan {@link ReadOnly}'s check sees (and refuses when it writes); every other is refused here. */
  private static final Set<Command.CommandTypeCase> PLANNED = Set.of(
      Command.CommandTypeCase.SQL_COMMAND,
      Command.CommandTypeCase.WRITE_OPERATION,
      Command.CommandTypeCase.WRITE_OPERATION_V2,
      Command.CommandTypeCase.MERGE_INTO_TABLE_COMMAND,
      Command.CommandTypeCase.CREATE_DATAFRAME_VIEW,
      Command.CommandTypeCase.GET_RESOURCES_COMMAND,
      Command.CommandTypeCase.REMOVE_CACHED_REMOTE_RELATION_COMMAND);

  private static final Map<Command.CommandTypeCase, String> COMMANDS = Map.of(
      Command.CommandTypeCase.REGISTER_FUNCTION, "registering a function (user code)",
      Command.CommandTypeCase.REGISTER_TABLE_FUNCTION, "registering a table function (user code)",
      Command.CommandTypeCase.REGISTER_DATA_SOURCE, "registering a data source (user code)",
      Command.CommandTypeCase.WRITE_STREAM_OPERATION_START, "a streaming write",
      Command.CommandTypeCase.CHECKPOINT_COMMAND, "checkpoint (writing the plan's data)",
      Command.CommandTypeCase.ML_COMMAND, "Spark ML (it saves and loads models by path)",
      Command.CommandTypeCase.EXECUTE_EXTERNAL_COMMAND, "an external command",
      Command.CommandTypeCase.PIPELINE_COMMAND, "a pipeline (it writes tables)");

  /** The Catalog API's calls that only read, or change nothing but the client's own session (its current database
   * or catalog, like {@code USE}); every other (the server's cache, tables, views, databases, partitions, and any
   * call a later Spark adds) is refused. */
  private static final Set<Catalog.CatTypeCase> CATALOG_READS = Set.of(
      Catalog.CatTypeCase.CURRENT_DATABASE,
      Catalog.CatTypeCase.SET_CURRENT_DATABASE,
      Catalog.CatTypeCase.LIST_DATABASES,
      Catalog.CatTypeCase.LIST_TABLES,
      Catalog.CatTypeCase.LIST_FUNCTIONS,
      Catalog.CatTypeCase.LIST_COLUMNS,
      Catalog.CatTypeCase.GET_DATABASE,
      Catalog.CatTypeCase.GET_TABLE,
      Catalog.CatTypeCase.GET_FUNCTION,
      Catalog.CatTypeCase.DATABASE_EXISTS,
      Catalog.CatTypeCase.TABLE_EXISTS,
      Catalog.CatTypeCase.FUNCTION_EXISTS,
      Catalog.CatTypeCase.IS_CACHED,
      Catalog.CatTypeCase.CURRENT_CATALOG,
      Catalog.CatTypeCase.SET_CURRENT_CATALOG,
      Catalog.CatTypeCase.LIST_CATALOGS,
      Catalog.CatTypeCase.LIST_PARTITIONS,
      Catalog.CatTypeCase.LIST_VIEWS,
      Catalog.CatTypeCase.GET_TABLE_PROPERTIES,
      Catalog.CatTypeCase.GET_CREATE_TABLE_STRING);

  @Override
  public <ReqT, RespT> ServerCall.Listener<ReqT> interceptCall(
      ServerCall<ReqT, RespT> call, Metadata headers, ServerCallHandler<ReqT, RespT> next) {
    String method = call.getMethodDescriptor().getFullMethodName();
    if (!CALLS.contains(method)) {
      String name = method.substring(method.lastIndexOf('/') + 1);
      deny(call, name.equals("AddArtifacts") ? "uploading artifacts (jars, Python files: loading code)" : name);
      return new ServerCall.Listener<ReqT>() {};
    }
    return new ForwardingServerCallListener.SimpleForwardingServerCallListener<ReqT>(next.startCall(call, headers)) {
      private boolean denied;

      @Override
      public void onMessage(ReqT message) {
        String what = refusal(message);
        if (what == null) {
          super.onMessage(message);
        } else {
          denied = true;
          deny(call, what);
        }
      }

      @Override
      public void onHalfClose() {
        if (!denied) {
          super.onHalfClose();
        }
      }
    };
  }

  private static <ReqT, RespT> void deny(ServerCall<ReqT, RespT> call, String what) {
    call.close(Status.PERMISSION_DENIED.withDescription(ReadOnly.refused(what).getMessage()), new Metadata());
  }

  /** What a request does that a read-only session may not, or null. */
  static String refusal(Object message) {
    if (message instanceof ConfigRequest config && config.hasOperation()) {
      ConfigRequest.Operation operation = config.getOperation();
      List<String> keys = switch (operation.getOpTypeCase()) {
        case SET -> operation.getSet().getPairsList().stream().map(KeyValue::getKey).toList();
        case UNSET -> operation.getUnset().getKeysList();
        default -> List.of();
      };
      for (String key : keys) {
        if (!ReadOnly.settable(key)) {
          return "setting " + key;
        }
      }
      return null;
    }
    if (message instanceof AnalyzePlanRequest analyze) {
      if (analyze.hasPersist()) {
        return "caching (persist)";
      }
      return refusalIn(analyze);
    }
    if (message instanceof ExecutePlanRequest execute) {
      if (execute.getPlan().hasCommand()) {
        Command.CommandTypeCase kind = execute.getPlan().getCommand().getCommandTypeCase();
        if (!PLANNED.contains(kind)) {
          return COMMANDS.getOrDefault(kind, "the command " + kind.name().toLowerCase());
        }
      }
      return refusalIn(execute);
    }
    return null;
  }

  /** Reads by path and Scala/Java functions anywhere in a request's plan (Python's are the check's, in the plan). */
  private static String refusalIn(Message message) {
    if (message instanceof Catalog catalog && !CATALOG_READS.contains(catalog.getCatTypeCase())) {
      return "catalog." + camelCase(catalog.getCatTypeCase().name()) + " (it changes the server)";
    }
    if (message instanceof Read read && read.hasDataSource()) {
      return "reading files by path (spark.read … load; name a lake table as layer.table)";
    }
    if (message instanceof CommonInlineUserDefinedFunction function
        && (function.hasScalarScalaUdf() || function.hasJavaUdf())) {
      return "a Scala/Java function (user code)";
    }
    if (message instanceof Expression expression && expression.hasTypedAggregateExpression()) {
      return "a typed aggregate (Scala user code)";
    }
    for (Object value : message.getAllFields().values()) {
      for (Object item : value instanceof List<?> items ? items : List.of(value)) {
        if (item instanceof Message inner) {
          String found = refusalIn(inner);
          if (found != null) {
            return found;
          }
        }
      }
    }
    return null;
  }

  /** ``CACHE_TABLE`` as the client's API names it: ``cacheTable``. */
  private static String camelCase(String name) {
    StringBuilder out = new StringBuilder();
    for (String word : name.toLowerCase().split("_")) {
      out.append(out.length() == 0 ? word : Character.toUpperCase(word.charAt(0)) + word.substring(1));
    }
    return out.toString();
  }
}
