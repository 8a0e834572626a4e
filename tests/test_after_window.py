"""The after-window passes' one stepping function: skipped steps, then the traced ones, the stream closed."""

from types import SimpleNamespace

import pytest

from pipebench.measure.after_window import run_steps


class _Loop:
    """A step loop that counts its steps and whether its stream was closed; fails at step `fail_at`."""

    def __init__(self, fail_at: int = -1) -> None:
        self.steps, self.fail_at, self.window = 0, fail_at, []
        self.stream = SimpleNamespace(closed=False)
        self.stream.close = lambda: setattr(self.stream, "closed", True)

    def step(self, sink):
        assert sink is None  # an extra pass never reaches the job's timings
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("step failed")
        return self.steps

    def begin_window(self):
        self.window.append(("begin", self.steps))

    def end_window(self, steps):
        self.window.append(("end", self.steps))
        return steps


def test_run_steps_skips_then_steps_inside_its_context_and_closes_the_stream():
    loop, entered = _Loop(), []

    class Around:
        def __enter__(self):
            entered.append(loop.steps)

        def __exit__(self, *exc):
            entered.append(loop.steps)

    assert run_steps(loop, 3, "label", around=Around(), skip=2) == [3, 4, 5]
    assert entered == [2, 5] and loop.window == [("begin", 2), ("end", 5)] and loop.stream.closed


def test_run_steps_closes_the_stream_when_a_step_fails():
    loop = _Loop(fail_at=2)
    with pytest.raises(RuntimeError, match="step failed"):
        run_steps(loop, 3)
    assert loop.stream.closed
