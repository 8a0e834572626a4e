"""What eats the batches in the step loop: nothing, or an emulated accelerator that sleeps."""

import time
from typing import Any

from pipebench.specs import ConsumerSpec


class NoConsumer:
    """Pure loader throughput: the step is the wait for data."""

    def step(self, data: Any, labels: Any) -> None:
        return None


class EmulatedConsumer:
    """Sleeps `step_ms` per step, the MLPerf Storage way of standing in for an accelerator.

    Sleeping takes no CPU from the workers, as a real accelerator would not.
    """

    def __init__(self, step_ms: float) -> None:
        self.step_s = step_ms / 1000.0

    def step(self, data: Any, labels: Any) -> None:
        time.sleep(self.step_s)


def build_consumer(spec: ConsumerSpec):
    return EmulatedConsumer(spec.step_ms) if spec.kind == "emulated" else NoConsumer()
