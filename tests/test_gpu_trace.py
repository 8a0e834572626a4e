"""Logic that runs on traces: HTA's idle breakdown, GPU busy %, and sync detection.

Two kinds of fixture under tests/fixtures/gpu/:
- HAND-BUILT ones (`*.json`), shaped like torch.profiler CUDA traces (ph "X", cat kernel /
  gpu_memcpy / cuda_runtime / cpu_op / user_annotation, args.correlation, args.stream, ac2g flow
  events), each rule's edge cases with every expected figure worked out by hand;
- RECORDED ones (`recorded/*_trace.json.gz`): the GPU traces of three jobs on an H100 host
  (2026-11-22, `benchmarks/gpu_check.py`, trimmed to the events and fields the analyses read),
  with `recorded/expected.json`: what those jobs reported in their summary.csv there. The
  analyses must reproduce those figures here, on a machine without a GPU.
"""

import gzip
import json
from pathlib import Path

import pytest

from pipebench.measure.gpu.idle import (
    CONSECUTIVE_KERNEL_DELAY_NS,
    classify_gaps,
    idle_breakdown,
)
from pipebench.measure.gpu.session import GPU_TRACE_STEPS, STEP_LABEL
from pipebench.measure.gpu.sync_detect import CONSUMER_LABEL, syncs_from_trace
from pipebench.measure.gpu.trace import (
    LAUNCH_CATEGORIES,
    gpu_events,
    launches_by_correlation,
    load_trace,
    windows,
)

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
RECORDED = FIXTURES / "recorded"


def test_parse_keeps_complete_events_in_ns_and_drops_flows_and_metadata():
    events = load_trace(FIXTURES / "idle_trace.json")
    assert len(events) == 17 and {e.cat for e in events} == {"user_annotation", "cuda_runtime", "kernel", "gpu_memcpy"}
    on_gpu = gpu_events(events)
    assert [e.stream for e in on_gpu].count(20) == 2 and len(on_gpu) == 8
    first = on_gpu[0]
    assert (first.name, first.dur_ns, first.correlation) == ("void conv_fwd_k1", 20_000, 100)
    launch = launches_by_correlation(events)[100]
    assert launch.name == "cudaLaunchKernel" and launch.start_ns == first.start_ns - 8_000


def test_hta_rule_classifies_each_gap_of_a_stream():
    events = load_trace(FIXTURES / "idle_trace.json")
    stream7 = [e for e in gpu_events(events) if e.stream == 7 and e.name != "void after_window"]
    gaps = classify_gaps(stream7, launches_by_correlation(events))
    # kernel wait: 20 ns after k1, launched before k1 ended; host wait: k3 launched 15 us after k2
    # ended; other: a memcpy whose launch call began 2 us before k3 ended (and ended 3 us after: only
    # the call's start counts) yet ran 5 us late, and a kernel with no launch found.
    assert gaps == [("kernel_wait", 20), ("host_wait", 20_000), ("other", 5_000), ("other", 20_000)]
    # The threshold is HTA's consecutive_kernel_delay: below 20 ns the same gap is "other".
    assert classify_gaps(stream7, launches_by_correlation(events), consecutive_kernel_delay_ns=10)[0] == ("other", 20)
    assert CONSECUTIVE_KERNEL_DELAY_NS == 30


def test_idle_breakdown_and_busy_share_of_the_profiled_window():
    events = load_trace(FIXTURES / "idle_trace.json")
    (step,) = windows(events, STEP_LABEL)
    result = idle_breakdown(events, (step.start_ns, step.end_ns))
    # Busy: the union of [10,50) (k1, k2, k6 overlap across streams), [60,70), [75,80), [100,110),
    # [150,160) = 75 of 200 us. The kernel after the window is left out.
    assert result.window_ms == pytest.approx(0.2) and result.busy_ms == pytest.approx(0.075)
    assert result.gpu_busy_pct == pytest.approx(37.5) and result.gpu_events == 7
    assert result.streams == (7, 20)
    # Idle: host wait 20 (stream 7) + 100 (stream 20: k7 launched 90 us after k6 ended) us,
    # kernel wait 0.02 us, other 25 us; shares of 145.02 us.
    assert result.idle_ms == pytest.approx({"host_wait": 0.120, "kernel_wait": 0.00002, "other": 0.025})
    total = 145.02
    assert result.idle_pct == pytest.approx({"host_wait": 100 * 120 / total, "kernel_wait": 100 * 0.02 / total,
                                             "other": 100 * 25 / total})
    assert sum(result.idle_pct.values()) == pytest.approx(100.0)


def test_idle_breakdown_of_a_trace_with_no_gpu_work_is_empty_not_zero():
    result = idle_breakdown([], (0, 1000))
    assert result.busy_ms == 0 and result.gpu_busy_pct == 0
    assert result.idle_pct == {"host_wait": None, "kernel_wait": None, "other": None}


def test_syncs_are_counted_under_ops_inside_the_consumer_step_and_named():
    count = syncs_from_trace(load_trace(FIXTURES / "masked_loss_sync_trace.json"))
    # Per step: nonzero (alone), boolean-mask indexing (index > nonzero) and unique (unique > _unique2).
    # Not counted: the H2D copy's stream sync (outside the consumer), and the CUDA-event syncs of
    # the copier and of the phase timer (under no op).
    assert (count.steps, count.syncs, count.per_step) == (2, 6, 3.0)
    assert count.ops == {"aten::nonzero": 2, "aten::index > aten::nonzero": 2, "aten::unique > aten::_unique2": 2}
    assert count.wait_ms == pytest.approx(2 * (0.020 + 0.030 + 0.040))


def test_the_fixed_loss_trace_has_no_syncs():
    count = syncs_from_trace(load_trace(FIXTURES / "masked_loss_fixed_trace.json"))
    assert (count.steps, count.syncs, count.ops, count.wait_ms) == (2, 0, {}, 0.0)


def test_a_trace_without_consumer_windows_counts_no_steps():
    count = syncs_from_trace(load_trace(FIXTURES / "masked_loss_sync_trace.json"), label="no such label")
    assert count.steps == 0 and count.syncs == 0


# --- recorded on an H100 (tests/fixtures/gpu/recorded) -----------------------------------------

RECORDED_JOBS = ("masked_loss_sync", "masked_loss_fixed", "toy_cnn")


def _expected(name: str) -> dict:
    return json.loads((RECORDED / "expected.json").read_text())[name]


def _recorded(name: str) -> list:
    return load_trace(RECORDED / f"{name}_trace.json.gz")


def test_a_gzipped_trace_reads_as_its_json(tmp_path):
    plain = tmp_path / "trace.json"
    plain.write_text(gzip.decompress((RECORDED / "toy_cnn_trace.json.gz").read_bytes()).decode())
    assert load_trace(plain) == _recorded("toy_cnn")


@pytest.mark.parametrize("name", RECORDED_JOBS)
def test_recorded_traces_give_the_idle_breakdown_the_gpu_host_reported(name):
    events = _recorded(name)
    steps = windows(events, STEP_LABEL)
    assert len(steps) == GPU_TRACE_STEPS
    result = idle_breakdown(events, (steps[0].start_ns, steps[-1].end_ns))
    expected = _expected(name)
    assert result.gpu_busy_pct == pytest.approx(expected["gpu_busy_pct"], rel=1e-9)
    assert result.idle_pct == pytest.approx({"host_wait": expected["idle_host_wait_pct"],
                                             "kernel_wait": expected["idle_kernel_wait_pct"],
                                             "other": expected["idle_other_pct"]}, abs=1e-9)
    # A starved GPU: nearly all of its idle time waits for the host (the loader).
    assert result.idle_pct["host_wait"] > 99


@pytest.mark.parametrize("name", RECORDED_JOBS)
def test_recorded_traces_give_the_syncs_the_gpu_host_reported(name):
    count = syncs_from_trace(_recorded(name))
    expected = _expected(name)
    assert count.steps == GPU_TRACE_STEPS and count.per_step == expected["syncs_per_step"]
    assert (count.ops_text() or "") == expected["sync_ops"]
    assert count.wait_ms / count.steps == pytest.approx(expected["sync_wait_ms_per_step"], rel=1e-9)


def test_recorded_sync_variant_syncs_in_nonzero_mask_indexing_and_unique():
    count = syncs_from_trace(_recorded("masked_loss_sync"))
    assert count.ops == {"aten::nonzero": 5, "aten::index > aten::nonzero": 5,
                         "aten::_unique2 > aten::_local_scalar_dense": 5}


@pytest.mark.parametrize("name", RECORDED_JOBS)
def test_the_harness_own_syncs_in_recorded_traces_are_not_counted(name):
    """Each recorded step has the phase timer's cudaEventSynchronize inside the consumer window
    and the copier's before it, both under no operator: real syncs, left out by the rule."""
    events = _recorded(name)
    consumer = windows(events, CONSUMER_LABEL)
    event_syncs = [e for e in events if e.cat in LAUNCH_CATEGORIES and e.name == "cudaEventSynchronize"]
    inside = [e for e in event_syncs if any(w.contains(e) for w in consumer)]
    assert len(inside) == len(consumer) == GPU_TRACE_STEPS and len(event_syncs) == 2 * GPU_TRACE_STEPS
    counted = syncs_from_trace(events).ops
    assert not any("EventSynchronize" in op for op in counted)
