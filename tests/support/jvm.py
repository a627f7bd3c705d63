"""Options for the short-lived JVMs tests start themselves (a cluster's processes, a plain Spark session's driver)."""

# C1 only: a JVM living a minute or two never earns back C2's optimizing compiles (the same Delta work took 40 CPU s
# instead of 70), nor does test_postgres's stack's Spark Connect server in its few minutes (162 CPU s instead of 221);
# a JVM living the whole run (the workers' session, the product's) keeps the default, and so does the embedded
# stack's server, busy for a quarter of an hour (C1 alone was not measured cheaper there)
QUICK_JIT = "-XX:TieredStopAtLevel=1"
