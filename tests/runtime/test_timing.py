"""The one timing policy (warm-up, flush before every timed run, adaptive repeat count), on a fake clock."""

from __future__ import annotations

import pytest

from schedlib.runtime.timing import repetitions, summarize


class FakeClock:
    def __init__(self, per_run_us: float) -> None:
        self.per_run_us, self.events = per_run_us, []

    def run(self) -> float:
        self.events.append("run")
        return self.per_run_us

    def flush(self, i: int) -> None:
        self.events.append(f"flush{i}")


def test_warmup_then_flush_before_every_timed_run() -> None:
    clock = FakeClock(10.0)
    times = repetitions(clock.run, clock.flush, warmup_runs=3, min_repeats=4, max_repeats=4)
    assert times == [10.0] * 4
    assert clock.events == ["run"] * 3 + [e for i in range(4) for e in (f"flush{i}", "run")]


def test_warmup_lasts_warmup_ms_and_repeats_fill_target_ms() -> None:
    clock = FakeClock(100.0)  # 0.1 ms per run
    times = repetitions(clock.run, None, warmup_runs=1, warmup_ms=1.0, target_ms=2.0, min_repeats=5,
                        max_repeats=1000)
    assert clock.events.count("run") == 10 + 20  # 1 ms of warm-up, then 2 ms of timed runs
    assert len(times) == 20


@pytest.mark.parametrize(("target_ms", "expected"), [(0.0, 5), (1000.0, 50)])
def test_repeat_count_is_clamped(target_ms: float, expected: int) -> None:
    times = repetitions(FakeClock(100.0).run, None, target_ms=target_ms, min_repeats=5, max_repeats=50)
    assert len(times) == expected


def test_factor_scales_the_repeat_count() -> None:
    assert len(repetitions(FakeClock(1.0).run, None, min_repeats=10, max_repeats=10, factor=3.0)) == 30


def test_summary_percentiles() -> None:
    s = summarize([float(v) for v in range(1, 11)])
    assert s["median_us"] == 5.5 and s["repeat"] == 10
    assert s["p20_us"] == pytest.approx(2.8) and s["p80_us"] == pytest.approx(8.2)
