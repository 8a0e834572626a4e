"""The timer charges cost to the right place: a step of known cost measures as that cost."""

import dataclasses

import pytest
import torch
from conftest import QUICK_RUN, TINY_DATASET, compose_spec
from known_cost_kit import known_cost
from torch.utils.data import DataLoader

from pipebench.base.errors import BatchStepError
from pipebench.datasets.random_tensors import RandomTensorDataset
from pipebench.datasets.sharded_stream import ShardedStream
from pipebench.measure.job import measure_job
from pipebench.pipeline.timed_chain import InstrumentedDataset, TimedCollate, set_profiling_labels
from pipebench.pipeline.timed_iterable import InstrumentedIterable
from pipebench.transforms.color import BatchScale, Scale
from pipebench.transforms.synthetic import BusyWait

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
# The tests marked `beside` read step counts, an error's line and profiler labels: they share the cores.
pytestmark = pytest.mark.alone

BUSY = "pipebench.transforms.synthetic.BusyWait"
SCALE = "pipebench.transforms.color.Scale"
# BusyWait spins until its thread has used X ms of CPU, so its CPU time is exact and its wall
# time can only grow when a shared machine preempts it. CPU time gets a tight bound; wall
# time a one-sided loose one. Both still catch time charged to the wrong step.
COST_TOLERANCE = 0.15
PREEMPTION_ALLOWANCE = 1.5


# The per-call medians and the CPU a sample are read over the quick run's 5 steps of 8 samples: a
# busy-wait's CPU time is exact, so no minimum time stretches the window for them. The rate and
# starvation tests keep run=quick's 0.5 s.
MEDIANS_ONLY = ["run.min_time_s=0"]


def _spec(per_sample, extra=()):
    spec = compose_spec([*TINY_DATASET, *QUICK_RUN, "run.profile_steps=0", *extra])
    return dataclasses.replace(spec, per_sample=tuple(per_sample))


def _rows(record):
    return {(r["stage"], r["transform"]): r for r in record.transforms}


@pytest.mark.parametrize("cost_ms", [2.0, 6.0])
@known_cost
def test_known_cost_step_dominates_and_measures_its_cost(tmp_path, cost_ms):
    spec = _spec([{"_target_": SCALE}, {"_target_": BUSY, "ms": cost_ms}, {"_target_": SCALE}], extra=MEDIANS_ONLY)
    record = measure_job(spec, tmp_path)
    rows = _rows(record)
    busy = rows[("per_sample", "BusyWait")]
    assert cost_ms * (1 - COST_TOLERANCE) <= busy["ms_per_call_median"] <= cost_ms * PREEMPTION_ALLOWANCE
    # The chain's CPU a sample is the busy wait's plus the other steps' own (their wall time bounds
    # their CPU time): at 2 ms a loaded host's cache misses in the small steps read as +17%.
    others_ms = sum(r["ms_per_sample"] for k, r in rows.items() if k != ("per_sample", "BusyWait"))
    cpu_ms = record.summary.cpu_ms_per_sample
    assert cost_ms * (1 - COST_TOLERANCE) <= cpu_ms <= cost_ms * (1 + COST_TOLERANCE) + others_ms
    assert busy["share_pct"] > 80
    assert max(r["share_pct"] for k, r in rows.items() if k != ("per_sample", "BusyWait")) < 10
    assert ("per_sample", "Scale#2") in rows, "repeated transforms get distinct rows"
    assert busy["calls"] == record.summary.steps * spec.loader.batch_size


@known_cost
def test_two_known_costs_split_in_proportion(tmp_path):
    spec = _spec([{"_target_": BUSY, "ms": 1.0}, {"_target_": BUSY, "ms": 3.0}], extra=MEDIANS_ONLY)
    rows = _rows(measure_job(spec, tmp_path))
    ratio = rows[("per_sample", "BusyWait#2")]["ms_per_call_median"] / rows[("per_sample", "BusyWait")]["ms_per_call_median"]
    assert ratio == pytest.approx(3.0, rel=COST_TOLERANCE)


@known_cost
def test_single_process_throughput_agrees_with_the_per_sample_sum(tmp_path):
    """With workers=0 and no consumer, a step is the chain itself: rate ≈ 1 / per-sample time."""
    spec = _spec([{"_target_": BUSY, "ms": 2.0}], extra=["consumer=none"])
    summary = measure_job(spec, tmp_path).summary
    predicted = 1000.0 / summary.pipeline_ms_per_sample
    assert summary.samples_per_s == pytest.approx(predicted, rel=0.1)
    assert summary.samples_per_s_ci_low <= summary.samples_per_s <= summary.samples_per_s_ci_high


@known_cost
def test_emulated_consumer_sets_starvation(tmp_path):
    """Data wait B·X = 8 x 2 ms against a 16 ms consumer: about half of each step is waiting."""
    spec = _spec([{"_target_": BUSY, "ms": 2.0}], extra=["consumer=emulated", "consumer.step_ms=16"])
    summary = measure_job(spec, tmp_path).summary
    assert summary.starvation_pct == pytest.approx(50, abs=10)
    assert summary.accel_util_pct == pytest.approx(100 - summary.starvation_pct, abs=2)


@pytest.mark.beside
def test_first_batch_is_kept_out_of_the_steady_state(tmp_path):
    spec = _spec([{"_target_": BUSY, "ms": 0.5}], extra=["run.warmup_steps=0", "run.steps=4", "run.min_time_s=0"])
    record = measure_job(spec, tmp_path)
    assert len(record.pass_records[0].step_ms) == record.summary.steps == 4
    assert record.summary.first_batch_s > 0


@known_cost
def test_on_device_steps_run_after_the_copy_and_are_charged_there(tmp_path):
    """A known-cost step in transform.on_device is timed in its own stage, counts in the CPU a
    sample and in the step, and the batch that crosses is what the collate made (uint8 here)."""
    batch_ms = 8.0
    spec = dataclasses.replace(_spec([], extra=MEDIANS_ONLY), on_device=({"_target_": BUSY, "ms": batch_ms},))
    record = measure_job(spec, tmp_path)
    rows = _rows(record)
    busy = rows[("on_device", "BusyWait")]
    assert busy["calls"] == record.summary.steps
    assert batch_ms * (1 - COST_TOLERANCE) <= busy["ms_per_call_median"] <= batch_ms * PREEMPTION_ALLOWANCE
    summary = record.summary
    assert summary.cpu_ms_per_sample >= batch_ms / spec.loader.batch_size * (1 - COST_TOLERANCE)
    assert summary.on_device_ms_median >= batch_ms * (1 - COST_TOLERANCE)
    assert summary.step_ms_median >= summary.on_device_ms_median
    record_passes = record.pass_records[0]
    assert len(record_passes.device_ms) == len(record_passes.step_ms)
    # random_tensors gives uint8 [3, 32, 32] samples: 8 of them cross as 24,576 bytes.
    assert summary.batch_mb_median == pytest.approx(spec.loader.batch_size * 3 * 32 * 32 / 1e6)


@pytest.mark.beside
def test_a_step_after_the_copy_that_fails_stops_the_job_with_one_line_naming_it_and_its_samples(tmp_path):
    """The GPU decode's step given what it cannot decode (here tensors, not JPEG bytes): one line, no
    traceback, as a corrupt JPEG decoded after the copy would give."""
    decode = {"_target_": "pipebench.transforms.decode.BatchDecodeJpeg", "device": "cpu"}
    spec = dataclasses.replace(_spec([]), on_device=(decode,))
    with pytest.raises(BatchStepError) as failed:
        measure_job(spec, tmp_path)
    line = str(failed.value)
    assert "\n" not in line
    assert line.startswith("transform.on_device step BatchDecodeJpeg failed on the batch of samples ")
    assert "ValueError: BatchDecodeJpeg: expected a list of JPEG byte strings" in line
    assert line.endswith("so run.on_error=skip cannot drop one sample there)")


@pytest.mark.beside
@pytest.mark.parametrize("stream", [False, True], ids=["map_style", "stream"])
def test_profiled_steps_get_one_label_per_step(stream):
    """Under torch.profiler (the profiled steps at workers=0) every step of the chain runs inside
    its record_function label, a stream's as a map-style dataset's: a stream once took a path that
    never labelled its steps. The batch is the one the unprofiled chain makes."""
    source = RandomTensorDataset(shape=[3, 4, 4], length=8)
    transforms = [BusyWait(0.0), Scale()]
    dataset = InstrumentedIterable(ShardedStream(source), transforms) if stream else \
        InstrumentedDataset(source, transforms)
    collate = TimedCollate([BatchScale()])
    loader = DataLoader(dataset, batch_size=4, collate_fn=collate)  # workers=0
    plain = next(iter(loader))
    set_profiling_labels(dataset, collate, True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        labelled = next(iter(loader))
    set_profiling_labels(dataset, collate, False)
    labels = {event.key: event.count for event in prof.key_averages()}
    load = "load/ShardedStream" if stream else "load/RandomTensorDataset"
    assert {name: labels.get(name) for name in (load, "per_sample/BusyWait", "per_sample/Scale",
                                                "collate/default_collate", "per_batch/BatchScale")} == \
        {load: 4, "per_sample/BusyWait": 4, "per_sample/Scale": 4, "collate/default_collate": 1,
         "per_batch/BatchScale": 1}
    assert torch.equal(plain.data, labelled.data) and torch.equal(plain.labels, labelled.labels)
    assert plain.indices.tolist() == labelled.indices.tolist() == [0, 1, 2, 3]
