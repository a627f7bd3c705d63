"""Options for the short-lived JVMs tests start themselves (a cluster's processes, a plain Spark session's driver)."""

# C1 only: a JVM living a minute or two never earns back C2's optimizing compiles (the same Delta work took 40 CPU s
# instead of 70); a JVM living the whole run (the workers' session, the product's) keeps the default
QUICK_JIT = "-XX:TieredStopAtLevel=1"
