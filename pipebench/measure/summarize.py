"""Turn raw step samples and stage timings into the summary row and the per-transform rows."""

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from torch.utils.data import IterableDataset

from pipebench.base.stats import distribution
from pipebench.config.specs import PROCESSES, SYNC_ASYNC, SYNC_PER_STEP, JobSpec
from pipebench.measure.first_batch_parts import first_batch_columns
from pipebench.measure.steps import NS_PER_MS, PassResult, StepSample, TimingSink
from pipebench.measure.storage_io import file_read_figures
from pipebench.measure.window import Window, steady_masks, steady_state
from pipebench.measure.cpu_reference import REFERENCE_VERSION
from pipebench.pipeline.stages import DECODE_STAGE, LOAD_STAGE, PER_SAMPLE_STAGE
from pipebench.pipeline.timed_chain import StepName
from pipebench.record.sections import TransformRow, measured_row

BYTES_PER_MB = 1e6
# The fewest CPU reference runs a window's mean is taken over: the mean of one or two runs
# moves with one preempted run (a run's own spread here is 10-20%), which is the noise the
# reference is there to take out. A chain that cheap gets no reference, and compare says so.
MIN_REFERENCE_RUNS = 3


def transform_rows(sink: TimingSink, sample_steps: Sequence[StepName], batch_steps: Sequence[StepName]
                   ) -> List[TransformRow]:
    """One row per step. share_pct is of all instrumented time, so the rows add up to 100. The
    decode row shows only when something was decoded there (a lazily opened image), the load row
    only when the load was timed (a watched dataset that fetches its batches itself is not)."""
    if not sink.sample_ns:
        return []
    per_sample = np.concatenate(sink.sample_ns, axis=0)  # [n_samples, n_sample_steps]
    per_batch = np.stack(sink.batch_ns)  # [n_batches, n_batch_steps]
    n_samples = per_sample.shape[0]
    columns = [(name, per_sample[:, i]) for i, name in enumerate(sample_steps)]
    columns += [(name, per_batch[:, i]) for i, name in enumerate(batch_steps)]
    columns = [(name, col) for name, col in columns if name.stage not in (DECODE_STAGE, LOAD_STAGE) or col.any()]
    total_ns = float(sum(col.sum() for _, col in columns)) or 1.0
    return [
        TransformRow(
            stage=name.stage,
            transform=name.name,
            calls=int(col.size),
            ms_per_call_mean=float(col.mean() / NS_PER_MS),
            ms_per_call_median=float(np.median(col) / NS_PER_MS),
            ms_per_sample=float(col.sum() / NS_PER_MS / n_samples),
            share_pct=float(100.0 * col.sum() / total_ns),
        )
        for name, col in columns
    ]


# The workers_breakdown entry of the batches a thread backend collates: its collate runs on a
# thread of its own, beside the pool's workers, so that time is no worker's.
COLLATE_THREAD = "collate"
# Stages a sample goes through in a worker (the rest run once a batch).
SAMPLE_STAGES = (LOAD_STAGE, DECODE_STAGE, PER_SAMPLE_STAGE)


def _sample_workers(sink: TimingSink) -> List[np.ndarray]:
    """Each batch's per-sample workers; the batch's own worker where they were not recorded (a
    sink from before they were, or a watched loader's)."""
    if len(sink.sample_workers) == len(sink.sample_ns):
        return sink.sample_workers
    return [np.full(ns.shape[0], w, np.int64) for ns, w in zip(sink.sample_ns, sink.worker_ids)]


def _worker_figures(batches: int, samples: int, wall_ns: float, cpu_ns: float, startup_s: float
                    ) -> Dict[str, float]:
    """One workers_breakdown entry: its batches and samples, its wall and CPU ms a sample, its start-up."""
    return {"batches": batches, "samples": samples, "ms_per_sample": wall_ns / NS_PER_MS / samples,
            "cpu_ms_per_sample": cpu_ns / NS_PER_MS / samples, "startup_s": startup_s}


def worker_breakdown(sink: TimingSink, passes: Sequence[PassResult]) -> Dict[str, Dict[str, float]]:
    """Per worker (a process, a pool thread, or -1: the main process at workers=0): the samples it
    made, the batches it collated, its wall and CPU time a sample, its start-up and its file reads.
    A thread backend's collate thread is no worker: its batches go under COLLATE_THREAD."""
    out: Dict[str, Dict[str, float]] = {}
    made_by = _sample_workers(sink)
    with_io = len(sink.sample_io) == len(sink.sample_ns)  # a rank's saved sink keeps no reads
    for worker in sorted({int(w) for workers in made_by for w in workers}):
        masks = [workers == worker for workers in made_by]
        collated = [i for i, w in enumerate(sink.worker_ids) if w == worker]
        n_samples = sum(int(m.sum()) for m in masks)
        wall_ns = sum(float(ns[m].sum()) for ns, m in zip(sink.sample_ns, masks))
        cpu_ns = sum(float(cpu[m].sum()) for cpu, m in zip(sink.sample_cpu_ns, masks))
        wall_ns += sum(float(sink.batch_ns[i].sum()) for i in collated)
        cpu_ns += sum(float(sink.batch_cpu_ns[i]) for i in collated)
        startups = [p.worker_startup_s[worker] for p in passes if worker in p.worker_startup_s]
        out[str(worker)] = _worker_figures(len(collated), n_samples, wall_ns, cpu_ns,
                                           max(startups) if startups else float("nan"))
        if with_io:
            out[str(worker)].update(file_read_figures(np.concatenate([io[m] for io, m in zip(sink.sample_io, masks)]),
                                                      np.concatenate([ns[m, 0] for ns, m in zip(sink.sample_ns, masks)])))
    apart = [i for i, w in enumerate(sink.worker_ids) if str(w) not in out]
    if apart:
        out[COLLATE_THREAD] = _worker_figures(len(apart), sum(sink.sample_ns[i].shape[0] for i in apart),
                                              sum(float(sink.batch_ns[i].sum()) for i in apart),
                                              sum(float(sink.batch_cpu_ns[i]) for i in apart), float("nan"))
    return out


def worker_capacity(rows: Sequence[TransformRow], workers: int, worker_kind: str) -> float:
    """Samples/s W busy workers deliver, time-slicing (and under threads the GIL) included: W / the
    chain's wall ms a sample; for a thread pool never past what its one collate thread gets through."""
    producers = max(workers, 1)
    if worker_kind == PROCESSES:
        pipeline_ms = float(sum(r.ms_per_sample for r in rows))
        return producers * 1000.0 / pipeline_ms if pipeline_ms > 0 else float("nan")
    sample_ms = float(sum(r.ms_per_sample for r in rows if r.stage in SAMPLE_STAGES))
    batch_ms = float(sum(r.ms_per_sample for r in rows if r.stage not in SAMPLE_STAGES))
    limits = [producers * 1000.0 / sample_ms if sample_ms > 0 else float("inf"),
              1000.0 / batch_ms if batch_ms > 0 else float("inf")]
    return min(limits) if min(limits) < float("inf") else float("nan")


def cpu_ms_per_sample(sink: TimingSink) -> float:
    """Thread CPU time of the whole pipeline per sample: what a core must spend, contention aside."""
    if not sink.sample_cpu_ns:
        return float("nan")
    samples = sum(a.shape[0] for a in sink.sample_cpu_ns)
    return float((sum(a.sum() for a in sink.sample_cpu_ns) + sum(sink.batch_cpu_ns)) / NS_PER_MS / samples)


def reference_cpu_ms(sink: TimingSink) -> float:
    """Mean thread CPU ms of the CPU reference runs beside the measured batches; NaN with fewer than
    MIN_REFERENCE_RUNS. The mean, not the median: a run's cost fell in two modes (5.5 and 7.5 ms on
    the 2-core VM), and the median jumped between them, 8-8.5% round to round, where the mean moved
    4.6-5.8% (benchmarks/reference_noise.py)."""
    if len(sink.reference_cpu_ns) < MIN_REFERENCE_RUNS:
        return float("nan")
    return float(np.mean(sink.reference_cpu_ns) / NS_PER_MS)


def _median_ms(values_ns: Sequence[int]) -> float:
    return float(np.median(values_ns) / NS_PER_MS) if len(values_ns) else float("nan")


def _on_gpu_clock(steps: Sequence[StepSample]) -> bool:
    """The steps carry the GPU's own timeline (run.sync=async) rather than host phase times."""
    return bool(steps) and all(s.gpu_busy_ns is not None for s in steps)


def _ns(steps: Sequence[StepSample], field: str) -> np.ndarray:
    return np.array([getattr(s, field) for s in steps], dtype=np.float64)


def accel_util_pct(steps: Sequence[StepSample]) -> float:
    """The consumer's busy share of `steps`: from the GPU's timeline where they carry it, else the host's."""
    if _on_gpu_clock(steps):
        return gpu_clock_figures(steps).accel_util_pct
    return float(100.0 * _ns(steps, "compute_ns").sum() / _ns(steps, "step_ns").sum())


def au_pct(passes: Sequence[PassResult]) -> float:
    """Accelerator utilisation the MLPerf Storage way: the consumer's busy share of every measured step
    of every pass, epoch ends included (accel_util_pct keeps only the steady whole cycles); the first
    batch's wait (reported as first_batch_s) and the warm-up steps are outside the measured steps."""
    return accel_util_pct([s for p in passes for s in p.steps])


@dataclass(frozen=True)
class StepShares:
    """The summary's shares of the steady steps: starvation, the other idle share (on the GPU's clock
    only) and accel_util_pct, and the consumer's busy time a step."""

    starvation_pct: float
    starvation_other_pct: Optional[float]
    accel_util_pct: float
    consumer_ms_median: float


def gpu_clock_figures(steps: Sequence[StepSample]) -> StepShares:
    """run.sync=async: starvation, the other idle share and accel_util_pct as shares of the GPU's
    own window (each step from the previous step's last kernel to its own), and the consumer's
    busy time a step; they add up to 100%."""
    span = _ns(steps, "gpu_span_ns")
    busy = _ns(steps, "gpu_busy_ns")
    return StepShares(float(100.0 * _ns(steps, "gpu_idle_data_ns").sum() / span.sum()),
                      float(100.0 * _ns(steps, "gpu_idle_other_ns").sum() / span.sum()),
                      float(100.0 * busy.sum() / span.sum()), float(np.median(busy) / NS_PER_MS))


def epoch_size(spec: JobSpec, dataset: Any, loader: Any) -> Tuple[Optional[int], Optional[int]]:
    """Batches and samples in one epoch of a map-style dataset, for the summary's epoch figures;
    (None, None) for a stream."""
    if isinstance(dataset, IterableDataset):
        return None, None
    batches = len(loader)
    return batches, batches * spec.loader.batch_size if spec.loader.drop_last else len(dataset)


def summary_row(window: Window, rows: Sequence[TransformRow], sink: TimingSink, workers: int, usable_cores: int,
                skipped: int, persistent: bool = False, samples_per_epoch: Optional[int] = None,
                batches_per_epoch: Optional[int] = None, target_steps: int = 0,
                worker_kind: str = PROCESSES) -> Dict[str, object]:
    """Steady-state figures over whole worker cycles of every repeat, from the job's one cut of its
    window; the first batch and the epoch ends' cycles are reported apart (restart cost, epoch rate).
    Two capacities check the transform rows against the measured rate: `worker_capacity` (W busy
    workers, time-slicing included) and min(W, cores) / CPU ms a sample (the machine's best; under
    threads a bound the GIL may keep far off).
    """
    passes = window.passes
    on_gpu_clock = _on_gpu_clock([s for p in passes for s in p.steps])
    steady = steady_state(window, "gpu_span_ns" if on_gpu_clock else "step_ns", workers, persistent,
                          samples_per_epoch, batches_per_epoch, target_steps)
    steps, step_ns = steady.steps, steady.step_ns
    wait_ns, compute_ns = _ns(steps, "wait_ns"), _ns(steps, "compute_ns")
    step = distribution(step_ns / NS_PER_MS)
    wait = distribution(wait_ns / NS_PER_MS)
    shares = gpu_clock_figures(steps) if on_gpu_clock else StepShares(
        float(100.0 * wait_ns.sum() / step_ns.sum()), None, float(100.0 * compute_ns.sum() / step_ns.sum()),
        float(np.median(compute_ns) / NS_PER_MS))
    pipeline_ms = float(sum(r.ms_per_sample for r in rows))
    cpu_ms = cpu_ms_per_sample(sink)
    producers = max(workers, 1)
    startups = [s for p in passes for s in p.worker_startup_s.values()]
    return {
        "samples_per_s": steady.rate,
        "samples_per_s_ci_low": steady.interval.low,
        "samples_per_s_ci_high": steady.interval.high,
        "ci_blocks": steady.interval.blocks,
        "ci_note": steady.interval.note,
        "samples_per_s_epoch": steady.epoch_rate,
        "epoch_restart_s": steady.cost.restart_s,
        "epoch_restart_source": steady.cost.source,
        "epoch_boundaries_in_window": len(steady.window.boundary_cycles),
        "step_ms_mean": step.mean,
        "step_ms_var": step.var,
        "step_ms_median": step.median,
        "step_ms_iqr": step.iqr,
        "step_ms_p99": step.p99,
        "wait_ms_mean": wait.mean,
        "wait_ms_median": wait.median,
        "wait_ms_p99": wait.p99,
        **asdict(shares),
        "au_pct": au_pct(passes),
        "step_sync": SYNC_ASYNC if on_gpu_clock else SYNC_PER_STEP,
        "h2d_ms_median": float(np.median([s.h2d_ns for s in steps]) / NS_PER_MS),
        "transfer_ms_median": float(np.median([s.transfer_ns for s in steps]) / NS_PER_MS),
        "ready_next_ms_median": _median_ms([s.wait_ns for s in steps if s.ready]),
        "batch_mb_median": float(np.median([s.batch_bytes for s in steps]) / BYTES_PER_MB),
        "on_device_ms_median": _median_ms([s.device_ns for s in steps]),
        "ready_steps_pct": float(100.0 * sum(s.ready for s in steps) / len(steps)),
        "pipeline_ms_per_sample": pipeline_ms,
        "cpu_ms_per_sample": cpu_ms,
        "reference_cpu_ms": reference_cpu_ms(sink),
        "reference_version": REFERENCE_VERSION,
        "worker_capacity_samples_per_s": worker_capacity(rows, workers, worker_kind),
        "cpu_capacity_samples_per_s": min(producers, usable_cores) * 1000.0 / cpu_ms,
        "first_batch_s": float(np.median([p.first_batch_s for p in passes])),
        **first_batch_columns([p.first_batch for p in passes]),
        "worker_startup_s_max": max(startups) if startups else float("nan"),
        "steps": len(steady.window.steps),
        "repeats": len(passes),
        "skipped_samples": skipped,
        "epochs": max(p.epochs for p in passes),
        "window_note": steady.note,
    }


def pass_records(window: Window) -> List[Dict[str, object]]:
    """Every repeat's raw steps for result.json, each step marked steady or not (`summary_row`'s
    rule, from the same cut)."""
    return [{**pass_record(result), "steady": mask} for result, mask in zip(window.passes, steady_masks(window))]


def pass_record(result: PassResult) -> Dict[str, object]:
    """Raw per-step samples of one repeat, in ms, for result.json. `step_ms` is the step the
    summary counts: at run.sync=async its span on the GPU's clock (the host phases beside it
    then add up to the host's own time, which runs ahead)."""
    on_gpu_clock = _on_gpu_clock(result.steps)
    return {
        "first_batch_s": result.first_batch_s,
        "warmup_steps": result.warmup_steps,
        "drained_samples": result.drained_samples,
        "wall_s": result.wall_s,
        "epochs": result.epochs,
        "samples": [s.samples for s in result.steps],
        "gap_ms": [s.gap_ns / NS_PER_MS for s in result.steps],
        "wait_ms": [s.wait_ns / NS_PER_MS for s in result.steps],
        "h2d_ms": [s.h2d_ns / NS_PER_MS for s in result.steps],
        "device_ms": [s.device_ns / NS_PER_MS for s in result.steps],
        "compute_ms": [s.compute_ns / NS_PER_MS for s in result.steps],
        "step_ms": [(s.gpu_span_ns if on_gpu_clock else s.step_ns) / NS_PER_MS for s in result.steps],
        "transfer_ms": [s.transfer_ns / NS_PER_MS for s in result.steps],
        "worker_id": [s.worker_id for s in result.steps],
        "collective_ms": [s.collective_ns / NS_PER_MS for s in result.steps],
        "epoch": [s.epoch for s in result.steps],
        "start_epoch": result.start_epoch,
        "stop_reason": result.stop_reason,
        **({f"gpu_{name}_ms": [getattr(s, f"gpu_{name}_ns") / NS_PER_MS for s in result.steps]
            for name in ("idle_data", "idle_other", "busy")} if on_gpu_clock else {}),
    }


def rows_as_dicts(rows: Sequence[TransformRow]) -> List[Dict[str, object]]:
    return [measured_row(r) for r in rows]
