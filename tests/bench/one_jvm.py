"""Several Spark benches' ``--quick`` runs in one Python process, so that they pay for one JVM, not one each.

    python -m tests.bench.one_jvm <out-dir> <bench> [<bench> ...]

Each bench is imported from ``bench/`` and its ``main(["--quick"])`` called in turn, as ``python bench/<name>.py
--quick`` would call it. Every bench that starts Spark asks ``resources.spark.get_session`` for it with the same
configuration, so the first one starts the JVM and the others reuse it (a bench that asked for another
configuration would fail on ``get_session``'s own check, naming itself, not silently share).

What each bench printed goes to ``<out-dir>/<bench>.out`` and ``.err``, its exit status to ``.rc`` and its wall time
to ``.seconds``: the suite reads them as it reads a bench run as a process of its own. A bench that raises or exits
non-zero does not stop the others; its traceback goes to its ``.err``.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def exit_status(code: object) -> int:
    """The status a process would exit with after ``sys.exit(code)`` or ``return code`` from main."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # SystemExit("message") prints it and exits 1
    return 1


def run(name: str, out: Path) -> int:
    with (
        (out / f"{name}.out").open("w") as stdout,
        (out / f"{name}.err").open("w") as stderr,
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        started = time.perf_counter()
        try:
            status = exit_status(importlib.import_module(f"bench.{name}").main(["--quick"]))
        except SystemExit as stop:
            status = exit_status(stop.code)
        except BaseException:  # noqa: BLE001 - the bench's failure is reported, and the next bench still runs
            traceback.print_exc()
            status = 1
        seconds = time.perf_counter() - started
    (out / f"{name}.rc").write_text(str(status))
    (out / f"{name}.seconds").write_text(f"{seconds:.1f}")
    print(f"{name}: exit {status} in {seconds:.1f} s", flush=True)
    return status


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit("usage: python -m tests.bench.one_jvm <out-dir> <bench> [<bench> ...]")
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    failed = [name for name in argv[1:] if run(name, out) != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
