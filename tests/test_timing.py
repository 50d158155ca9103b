"""strategies/timing.py (issue 41, finding 2): the host clock on the CPU, CUDA events on a GPU, chosen by device;
the CUDA path with torch.cuda's Event and stream made observable; the autotuner's measurements taken through it
(marks turned into seconds only when it decides). The Reducer's statistics through it: tests/test_reducer.py
(ready <= launch <= done) and tests/test_overlap.py."""

from __future__ import annotations

import pytest
import torch

from strategies.autotune import AutoTuner
from strategies.timing import CudaTimer, HostTimer, Timer, timer_for


def test_timer_for_picks_events_on_cuda_and_the_host_clock_elsewhere():
    assert isinstance(timer_for("cpu"), HostTimer)
    assert isinstance(timer_for(torch.device("meta")), HostTimer)
    cuda = timer_for(torch.device("cuda", 1))
    assert isinstance(cuda, CudaTimer) and cuda.device == torch.device("cuda", 1)
    assert isinstance(timer_for("cuda:0"), CudaTimer)


def test_host_timer_measures_with_perf_counter(monkeypatch):
    import strategies.timing as timing

    clock = iter([10.0, 10.25, 11.0])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    timer = HostTimer()
    start = timer.mark()
    assert timer.seconds(start, timer.mark()) == 0.25
    assert timer.since(start) == 1.0


def test_cuda_timer_records_events_on_the_devices_stream_and_waits_only_when_read(monkeypatch):
    log: list[tuple] = []

    class Event:
        made = 0

        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            Event.made += 1
            self.n = Event.made

        def record(self, stream=None) -> None:
            log.append(("record", self.n, stream))

        def synchronize(self) -> None:
            log.append(("synchronize", self.n))

        def elapsed_time(self, end: Event) -> float:
            return 1.5 * (end.n - self.n)  # milliseconds

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    timer = timer_for(torch.device("cuda", 2))
    a, b = timer.mark(), timer.mark()
    assert log == [("record", 1, "stream of cuda:2"), ("record", 2, "stream of cuda:2")]  # no wait at a mark
    assert timer.seconds(a, b) == pytest.approx(0.0015)
    assert log[-1] == ("synchronize", 2)  # reading waits for the later event only


class Ticks(Timer):
    """Marks are integers; a tick is a millisecond."""

    def __init__(self) -> None:
        self.now = 0

    def mark(self) -> int:
        self.now += 1
        return self.now

    def seconds(self, start: int, end: int) -> float:
        return (end - start) / 1000


def test_the_autotuner_keeps_marks_and_turns_them_into_seconds_when_it_decides():
    timer = Ticks()
    tuner = AutoTuner(None, 0, 2, 3, torch.device("cpu"), timer)
    for _ in range(2):  # two measured backwards: parameter 2 never ready (unused)
        t0 = timer.mark()
        tuner.begin(t0, measuring=True)
        tuner.ready(1, timer.mark())
        tuner.ready(0, timer.mark())
        tuner.end(t0, layout=None, mark=timer.mark())  # type: ignore[arg-type]
    ready = tuner._ready_seconds()
    assert [r[:2] for r in ready] == [[0.002, 0.001], [0.002, 0.001]] and all(r[2] != r[2] for r in ready)
    assert tuner._seconds(tuner.sync_s) == [0.003, 0.003]
    assert tuner._seconds(tuner.outside) == [0.001]  # from the first finalize's end to the second start
    assert tuner.timing  # still measuring: every backward is timed until the plan
