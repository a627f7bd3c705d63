"""The machine's calibration: one Spark session is calibrated once per process, however many benches ask."""

from __future__ import annotations

from typing import Any

from bench.calibration import calib_spark_ms


class CountingSession:
    """Just enough of a Spark session for the calibration's job: it counts the jobs run on it."""

    def __init__(self) -> None:
        self.jobs = 0

    def range(self, rows: int) -> CountingSession:
        return self

    def selectExpr(self, *expressions: str) -> CountingSession:  # noqa: N802 - Spark's name
        return self

    def groupBy(self, *columns: str) -> CountingSession:  # noqa: N802 - Spark's name
        return self

    def count(self) -> CountingSession:
        return self

    def collect(self) -> list[Any]:
        self.jobs += 1
        return [None] * 1000  # the job's 1,000 groups


def test_a_session_calibrated_once_answers_its_figure_again_without_running_the_job() -> None:
    session = CountingSession()
    first = calib_spark_ms(session)
    jobs = session.jobs
    assert jobs == 4  # the untimed first run and three timed ones
    assert calib_spark_ms(session) == first
    assert session.jobs == jobs
    other = CountingSession()
    calib_spark_ms(other)
    assert other.jobs == 4  # another session is calibrated on its own
