# The few targets people use. `make dev` and `make test` install everything they need into .venv/.
VENV        := .venv
UV          := $(VENV)/bin/uv
UV_VERSION  := 0.13.8
PYTHON      ?= python3
STAMP       := $(VENV)/.installed-stamp
JARS        := $(VENV)/jars
JARS_STAMP  := $(JARS)/.installed-stamp
REPORTS     := .test-reports

.PHONY: install system-packages dev dev-postgres test test-fast test-durations test-backfill-month lint format typecheck check clean-data

$(STAMP): pyproject.toml uv.lock
	@command -v java >/dev/null 2>&1 || { \
	  echo "error: 'java' was not found on PATH. Spark needs Java 17:"; \
	  echo "       apt-get install -y openjdk-17-jre-headless   (or set JAVA_HOME)"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' || { \
	  echo "error: $(PYTHON) is not Python 3.11 (set PYTHON=/path/to/python3.11)"; exit 1; }
	@test -x $(UV) || { $(PYTHON) -m venv $(VENV) && $(VENV)/bin/pip install --quiet uv==$(UV_VERSION); }
	@# bytecode at install: every code server, daemon, run and test process then skips compiling Dagster/PySpark (2-3x faster starts)
	$(UV) sync --locked --quiet --compile-bytecode
	@touch $(STAMP)

# The JVM code every Spark of the warehouse carries (pom.xml), into .venv/jars/, once per change of the pom or of
# resources/jvm: Delta Lake's Spark jars and hadoop-aws from Maven Central, and the warehouse's own classes (the
# catalog that resolves `layer.table` to the lake's Delta tables, the read-only check and Connect gate) compiled by
# Maven's compiler plugin against the pyspark wheel's jars. Copied into a fresh folder: a version left behind
# beside its successor would put two on Spark's classpath.
JVM_SOURCES := $(shell find resources/jvm -name '*.java')
$(JARS_STAMP): pom.xml $(JVM_SOURCES) | $(STAMP)
	@command -v mvn >/dev/null 2>&1 || { \
	  echo "error: 'mvn' was not found on PATH. Delta Lake's Spark jars (pom.xml) are fetched with Maven:"; \
	  echo "       apt-get install -y maven"; exit 1; }
	@command -v javac >/dev/null 2>&1 || { \
	  echo "error: 'javac' was not found on PATH. The warehouse's Spark classes are compiled at install:"; \
	  echo "       apt-get install -y openjdk-17-jdk-headless   (or set JAVA_HOME to a JDK 17)"; exit 1; }
	rm -rf $(JARS).tmp $(VENV)/jvm-build
	@# Debian's Maven 3.8 prints colour codes (`[0m[0m`) whatever its options (--batch-mode, -Dstyle.color=never, a
	@# log file): what it prints goes through a filter that drops them, and the recipe keeps Maven's exit status
	{ mvn --batch-mode --quiet -Dstyle.color=never --file pom.xml -Dmaven.test.skip=true \
	  -Dpyspark.jars="$$($(VENV)/bin/python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')/jars" \
	  package dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(JARS).tmp 2>&1; \
	  echo $$? > $(JARS).status; } \
	  | sed 's/\x1b\[[0-9;]*m//g'; status=$$(cat $(JARS).status); rm -f $(JARS).status; exit $$status
	cp $(VENV)/jvm-build/warehouse-spark-0.1.0.jar $(JARS).tmp/
	rm -rf $(JARS) && mv $(JARS).tmp $(JARS)
	@touch $(JARS_STAMP)

install: $(STAMP) $(JARS_STAMP)

# Debian packages the `stack` tests of real components start (PostgreSQL, MariaDB for the capture connector,
# Chromium and its WebDriver for the UI). CI runs as root: what is missing is installed after one `apt-get update`;
# elsewhere the tests needing it skip, saying why.
DEBIAN_PACKAGES := postgresql mariadb-server chromium chromium-driver
system-packages:
	@missing=$$(for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing $$missing"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "note: not installed and cannot install here (needs root and apt-get): $$missing;" \
	  "the tests that need them will skip"; fi

dev: install  ## simulated sources + Spark Connect + Dagster UI on http://127.0.0.1:3000
	DAGSTER_HOME=$(CURDIR)/dagster_home $(VENV)/bin/warehouse dev

dev-postgres: install  ## `make dev` on the PostgreSQL instance of dagster_home/postgres (DAGSTER_PG_* set)
	@for v in DAGSTER_PG_HOST DAGSTER_PG_PORT DAGSTER_PG_USER DAGSTER_PG_PASSWORD DAGSTER_PG_DB; do \
	  printenv $$v >/dev/null || { echo "error: $$v is not set (docs/operations.md: Production deployment)"; exit 1; }; done
	DAGSTER_HOME=$(CURDIR)/dagster_home/postgres $(VENV)/bin/warehouse dev

test: install system-packages  ## the whole test suite
	@command -v java >/dev/null 2>&1 || { echo "error: 'java' was not found on PATH (Spark needs Java 17)"; exit 1; }
	$(VENV)/bin/pytest -n 2 --dist loadfile --no-loadscope-reorder --junitxml=$(REPORTS)/junit.xml

# the last `make test`'s timings (its JUnit report, git-ignored) into tests/durations.json, which orders the workers
test-durations:
	$(VENV)/bin/python -m tests.support.update_durations $(REPORTS)/junit.xml --note "$(NOTE)"

test-fast: install  ## the pure tier: no Spark, no servers; `make test` runs every tier
	$(VENV)/bin/pytest -n 2 -m "not spark and not stack"

test-backfill-month: install  ## the backfill test over all of January, the whole graph (~25 min on 2 cores)
	BACKFILL_DAYS=31 BACKFILL_HOURLY_DAYS=31 $(VENV)/bin/pytest -s tests/test_backfill.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports  # the import contract in pyproject.toml: imports point one way

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: install
	$(VENV)/bin/mypy

check: lint typecheck test

clean-data:  ## forget the simulated sources, the lake and the Dagster instance state
	rm -rf data dagster_home/storage dagster_home/history dagster_home/schedules dagster_home/logs
