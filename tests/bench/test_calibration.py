"""The machine's calibration: measured once for the benches that ask for it, one Spark session once per process."""

from __future__ import annotations

from typing import Any

import pytest

from bench import calibration
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


def test_a_bench_given_the_callers_calib_ms_answers_it_without_running_the_workload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def workload() -> int:
        raise AssertionError("the workload ran although the caller had measured it")

    monkeypatch.setattr(calibration, "_resolver_like_work", workload)
    monkeypatch.setenv(calibration.CALIB_MS_ENV, "231.5")
    assert calibration.calib_ms() == 231.5
    monkeypatch.delenv(calibration.CALIB_MS_ENV)
    with pytest.raises(AssertionError, match="the workload ran"):
        calibration.calib_ms()  # without it, the bench measures
