"""Logic that runs on recorded traces: HTA's idle breakdown, GPU busy %, and sync detection.

The fixtures under tests/fixtures/gpu/ are HAND-BUILT (not recorded on a GPU), shaped like
torch.profiler CUDA traces (ph "X", cat kernel / gpu_memcpy / cuda_runtime / cpu_op /
user_annotation, args.correlation, args.stream, ac2g flow events). Every expected figure below
is worked out by hand from them. `benchmarks/gpu_check.py` records real ones on a GPU
(tests/fixtures/gpu/recorded/); the checks on those run only where they exist.
"""

import json
from pathlib import Path

import pytest

from pipebench.measure.gpu.idle import (
    CONSECUTIVE_KERNEL_DELAY_NS,
    classify_gaps,
    idle_breakdown,
)
from pipebench.measure.gpu.session import STEP_LABEL
from pipebench.measure.gpu.sync_detect import CONSUMER_LABEL, syncs_from_trace
from pipebench.measure.gpu.trace import (
    gpu_events,
    launches_by_correlation,
    load_trace,
    windows,
)

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


# --- recorded on a GPU by benchmarks/gpu_check.py (absent until someone runs it there) -----------

def _recorded(name: str) -> Path:
    path = RECORDED / name
    if not path.exists():
        pytest.skip(f"{path.name} not recorded yet: run benchmarks/gpu_check.py on a GPU machine")
    return path


def test_recorded_masked_loss_traces_show_syncs_only_for_the_sync_variant():
    sync = syncs_from_trace(load_trace(_recorded("masked_loss_sync_trace.json")))
    fixed = syncs_from_trace(load_trace(_recorded("masked_loss_fixed_trace.json")))
    assert sync.steps > 0 and sync.per_step >= 1 and fixed.steps > 0 and fixed.syncs == 0
    expected = json.loads(_recorded("expected.json").read_text())
    assert sync.per_step == expected["masked_loss_sync"]["syncs_per_step"]
    names = " ".join(sync.ops)
    assert "nonzero" in names and "unique" in names, sync.ops


def test_recorded_toy_cnn_trace_breaks_idle_time_down():
    events = load_trace(_recorded("toy_cnn_trace.json"))
    steps = windows(events, STEP_LABEL)
    result = idle_breakdown(events, (steps[0].start_ns, steps[-1].end_ns))
    assert 0 < result.gpu_busy_pct <= 100 and result.gpu_events > 0
    assert sum(v for v in result.idle_pct.values() if v is not None) == pytest.approx(100.0)
    expected = json.loads(_recorded("expected.json").read_text())["toy_cnn"]
    assert result.gpu_busy_pct == pytest.approx(expected["gpu_busy_pct"], rel=1e-6)
    assert windows(events, CONSUMER_LABEL)
