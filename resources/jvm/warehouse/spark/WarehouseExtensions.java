package warehouse.spark;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;

import scala.Function1;
import scala.runtime.BoxedUnit;

/**
 * The warehouse's additions to every Spark it starts ({@code spark.sql.extensions}): the check that makes a
 * read-only session (the analysts' server, see {@link ReadOnly}) refuse what is not a read, run on every analysed
 * plan before it executes, commands included (they run eagerly, after analysis).
 */
public final class WarehouseExtensions implements Function1<SparkSessionExtensions, BoxedUnit> {
  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    extensions.injectCheckRule(ReadOnlyCheck::new);
    return BoxedUnit.UNIT;
  }

  /** The check of one session: a no-op outside a read-only one. */
  static final class ReadOnlyCheck implements Function1<LogicalPlan, BoxedUnit> {
    private final SparkSession session;

    ReadOnlyCheck(SparkSession session) {
      this.session = session;
    }

    @Override
    public BoxedUnit apply(LogicalPlan plan) {
      if (ReadOnly.applies(session)) {
        ReadOnly.check(plan);
      }
      return BoxedUnit.UNIT;
    }
  }
}
