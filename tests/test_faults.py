"""Workers that die or hang give a clear one-line error instead of a traceback or a hang."""

import dataclasses
import os
import time

import pytest
from conftest import QUICK_RUN, TINY_DATASET, compose_spec

from pipebench.base.errors import WorkerError
from pipebench.measure.job import measure_job


class DieInWorker:
    """Kills its worker process outright, as the OOM killer would."""

    def __call__(self, sample):
        os._exit(3)


def _spec(per_sample, extra=()):
    spec = compose_spec([*TINY_DATASET, *QUICK_RUN, "workers=1", "consumer=none", "run.profile_steps=0", *extra])
    return dataclasses.replace(spec, per_sample=tuple(per_sample))


def test_dead_worker_is_a_worker_error(tmp_path):
    spec = _spec([{"_target_": f"{__name__}.DieInWorker"}])
    with pytest.raises(WorkerError, match="exited unexpectedly") as caught:
        measure_job(spec, tmp_path)
    assert "\n" not in str(caught.value)


def test_hung_worker_times_out(tmp_path):
    spec = _spec([{"_target_": "pipebench.transforms.synthetic.Sleep", "ms": 20_000}], ["loader.timeout_s=1"])
    start = time.monotonic()
    with pytest.raises(WorkerError, match="timed out") as caught:
        measure_job(spec, tmp_path)
    assert time.monotonic() - start < 15, "a hung worker must not hang the benchmark"
    assert "loader.timeout_s=1" in str(caught.value)
