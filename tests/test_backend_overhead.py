"""benchmarks/backend_overhead.py's rules: the rounds' order, and each side run alone."""

import importlib
import threading
from pathlib import Path

import pytest

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def overhead(monkeypatch):
    # In-process, with the benchmarks folder on the path as a script run puts it.
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("backend_overhead")


class _GraphInACycle:
    """A dropped loader graph as torchdata leaves one: its thread runs until the graph is
    collected, and a reference cycle keeps it from being freed when the side drops it."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.itself = self
        self.thread = threading.Thread(target=self.stop.wait, daemon=True)
        self.thread.start()

    def __del__(self) -> None:
        self.stop.set()


def test_a_side_ends_with_the_threads_it_started_ended(overhead):
    started = []

    def side() -> float:
        started.append(_GraphInACycle().thread)
        return 100.0

    assert overhead.alone(side)() == 100.0
    assert not started[0].is_alive(), "the side's graph ran on into the next side"


def test_rounds_alternate_which_side_runs_twice_and_the_twice_run_side_gives_the_aa_spread(overhead):
    calls = []

    def side(name, rates):
        def run() -> float:
            calls.append(name)
            return rates.pop(0)
        return run

    even = overhead.counterbalanced(0, side("plain", [100.0, 110.0]), side("harness", [99.0]))
    assert calls == ["plain", "harness", "plain"]
    assert (even.plain, even.harness, even.ratio) == (105.0, 99.0, pytest.approx(99.0 / 105.0))
    assert even.aa_pct == pytest.approx(10 / 105 * 100)

    calls.clear()
    odd = overhead.counterbalanced(1, side("plain", [100.0]), side("harness", [90.0, 90.0]))
    assert calls == ["harness", "plain", "harness"]
    assert (odd.plain, odd.harness, odd.aa_pct) == (100.0, 90.0, 0.0)


def test_a_miss_is_within_noise_only_inside_the_aa_spread(overhead):
    assert overhead.verdict(1.0, 0.0) == "PASS"
    assert overhead.verdict(0.95, 6.0) == "within noise"
    assert overhead.verdict(0.90, 6.0) == "FAIL"
