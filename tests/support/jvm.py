"""Options for the JVMs tests start themselves (a cluster's processes, a plain Spark session's driver) and for the
sessions each test worker's Python starts (tests/conftest.py)."""

# C1 only: a JVM living a minute or two never earns back C2's optimizing compiles (the same Delta work took 40 CPU s
# instead of 70), nor does test_postgres's stack's Spark Connect server in its few minutes (162 CPU s instead of 221);
# the embedded stack's server, busy for a quarter of an hour, takes SESSION_JIT below (C1 alone in its 48 MB was not
# measured cheaper there; with 240 MB its JVM spent 297 CPU s for the module against the default's 328, load ~15)
QUICK_JIT = "-XX:TieredStopAtLevel=1"

# A worker's own session lives the whole run: C1 alone too, but in the code cache C2's tiers would have had. Given
# only C1's default 48 MB, Spark's driver fills it and the cache's sweeper flushes and recompiles without end: over
# four Spark modules in one worker it took 60 of the JVM's 384 CPU s, as much as C2's compiles had saved (422.7 CPU s
# in all against 424.2 with the default JIT). With 240 MB: 290 CPU s and 248 s wall against the default's 325 and
# 375 in the same quiet window (calib_ms 220 and 231); C2's compiles had been 113 CPU s of that JVM, its collector 31
SESSION_CODE_CACHE_MB = 240
SESSION_JIT = f"{QUICK_JIT} -XX:ReservedCodeCacheSize={SESSION_CODE_CACHE_MB}m"
