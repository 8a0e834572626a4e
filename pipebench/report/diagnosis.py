"""Diagnosis: the cost model's prediction (pipebench.model.costs) beside what was measured, and what to change.

W/c assumes W worker processes. Under a thread backend (loader.backend=threads, spdl) the workers share
one interpreter, so W/c holds only for steps that release the GIL: those rows are left unpredicted (and
sized for no target) rather than given a wrong figure. What the model leaves out (collate and IPC
delivery, pin-memory, the main loop's bookkeeping, page cache) makes the gap between prediction and
measurement, so the report names the candidates.
"""

import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from pipebench.base.noise_figures import compare_half_width
from pipebench.base.tables import format_value, markdown_table
from pipebench.config.specs import BACKEND_WORKER_KINDS, NO_CONSUMER, PROCESSES, THREADS
from pipebench.model.costs import (
    ChainCosts,
    Prediction,
    TargetNeeds,
    needs_for_target,
    predict,
    target_line,
    workers_to_feed,
)
from pipebench.model.judging import APART, RUN_TO_RUN_RATE_FLOOR, judged
from pipebench.model.shards import idle_line, idle_readers, random_access_line, uneven_line
from pipebench.pipeline.stages import DECODE_STAGE, LOAD_STAGE
from pipebench.record.figures import nan_if_none
from pipebench.record.jobs import NOT_AXES, JobResult, override_pairs, varying_keys
from pipebench.record.sections import PassRecord
from pipebench.report.comparison import measured_rate, watched
from pipebench.report.job_sections import loader_settings, run_settings, sections_of
from pipebench.report.thread_advice import gil_bound_steps, gil_lines

# Overrides that never define a chain: the axis the model predicts along, and repetition.
NON_CHAIN_KEYS = ("workers", "distributed.nproc", *NOT_AXES)
# A measurement within this of the prediction is explained by the model; shared 2-core machines
# wobble by up to ~15% between back-to-back runs (benchmarks/overhead.py's A/A spread).
EXPLAINED_WITHIN = 0.15
# A measured rate this far below the cores' cap is named on the cap's own line, with the items that
# explain it; closer, the machine's wobble covers it. The band is EXPLAINED_WITHIN's, so every row the
# cap's line calls short is one the "Off the model" item names.
CAP_GAP_WORTH_NAMING = EXPLAINED_WITHIN
# The least relative noise of a CPU ms a sample measured once (no rounds to show its spread):
# per-transform timings of one job move by up to ~5% between back-to-back runs on this machine.
CPU_COST_NOISE_FLOOR = 0.05
# A median's ~95% interval is ±1.57·IQR/√n (the notched box plot of McGill, Tukey and Larsen).
MEDIAN_NOTCH = 1.57
# The axes a variant can differ along, and the override prefixes that name each; the first match
# wins, so a chain that differs in its transforms is judged as a chain whatever else differs.
AXIS_CHAIN, AXIS_CONSUMER, AXIS_PIN_MEMORY, AXIS_LOADER = "chain", "consumer", "pin_memory", "loader"
AXIS_PREFIXES = ((AXIS_CHAIN, ("transform", "dataset")), (AXIS_CONSUMER, ("consumer",)),
                 (AXIS_PIN_MEMORY, ("loader.pin_memory",)), (AXIS_LOADER, ("loader", "distributed")))
PAYS, DOES_NOT_PAY, WITHIN_NOISE = "pays", "does not pay", "within noise"
# Restarting non-persistent workers at every epoch end is worth a line once it costs this share
# of an epoch: below it the restart hides within a run's noise.
RESTART_SHARE_WORTH_NAMING = 0.05
# CPU a sample inside workers this much above the single-process figure is worth naming: below
# it the difference is within the per-sample timings' run-to-run noise.
WORKER_CPU_INFLATION = 1.05
# Consumers that spend main-process CPU while they run (the others sleep or wait on a GPU).
CPU_CONSUMERS = {("toy_cnn", "cpu")}
# A lone tail measured in a window is worth quoting from this many batches: any epoch may end with one
# batch from one worker, the last to finish its share.
LONE_TAIL_MIN_STEPS = 2


# What the prediction table shows for a row the model does not cover (threads; see the module doc).
NOT_PREDICTED = "n/a"
THREADS_BOUND = "n/a: threads share the GIL"


@dataclass(frozen=True)
class PredictedRow:
    chain: str
    ranks: int
    workers: int
    # None: the model does not apply (worker threads; see the module doc).
    predicted: Optional[Prediction]
    measured_samples_per_s: float
    measured_starvation_pct: float
    measured_cpu_ms_per_sample: float

    @property
    def gap(self) -> float:
        """Measured over predicted, minus one: negative when the pipeline falls short of the model
        (nan where nothing was predicted)."""
        if self.predicted is None:
            return float("nan")
        return self.measured_samples_per_s / self.predicted.samples_per_s - 1.0


@dataclass(frozen=True)
class Diagnosis:
    rows: Tuple[PredictedRow, ...]
    costs: Tuple[Tuple[str, ChainCosts], ...]
    advice: Tuple[str, ...]
    targets: Tuple[Tuple[str, TargetNeeds], ...] = ()


def _chain_overrides(result: JobResult) -> Dict[str, str]:
    """The job's override pairs that define its chain (NON_CHAIN_KEYS left out)."""
    return override_pairs(result.overrides, ignored=NON_CHAIN_KEYS)


def chain_labels(results: Sequence[JobResult]) -> List[str]:
    """Each job's chain: the overrides that differ between the jobs, less the worker count and the
    round (settings every job shares say nothing); `transform=NAME` when nothing differs."""
    overrides = [_chain_overrides(r) for r in results]
    differing = sorted(varying_keys(overrides))
    # A watched loader has no transform config: it goes by its job name (`loader=train.py:57`).
    return [",".join(f"{k}={o[k]}" for k in differing if k in o)
            or (r.job if r.summary.transform is None else f"transform={r.summary.transform}")
            for o, r in zip(overrides, results)]


def _consumer_ms(passes: Sequence[PassRecord]) -> float:
    """The consumer's time a step in a job's `passes`, copy included: the GPU's busy time from its own
    timeline (run.sync=async, where the host's step time is only the launch), else the host's."""
    if passes and all(p.gpu_busy_ms is not None for p in passes):
        steps = [b for p in passes for b in p.gpu_busy_ms]
    else:
        steps = [c + h for p in passes for c, h in zip(p.compute_ms, p.h2d_ms)]
    return float(np.median(steps)) if steps else float("nan")


def chain_costs(results: Sequence[JobResult]) -> ChainCosts:
    """One chain's costs, from its single-rank workers=0 jobs (median over rounds), else any workers=0
    job's, else its CPU time in workers."""
    serial = [r for r in results if r.summary.workers == 0 and _ranks(r) == 1] or \
        [r for r in results if r.summary.workers == 0]
    picked = serial or results
    first = picked[0]
    consumer = first.consumer_report
    # consumer=none times only the loop's bookkeeping: there is no consumer to feed or keep busy.
    consumer_ms = 0.0 if consumer.kind == NO_CONSUMER else float(np.median([_consumer_ms(r.pass_records)
                                                                              for r in picked]))
    return ChainCosts(
        ms_per_sample=float(np.median([r.summary.pipeline_ms_per_sample if serial else r.summary.cpu_ms_per_sample
                                       for r in picked])),
        cpu_ms_per_sample=float(np.median([r.summary.cpu_ms_per_sample for r in picked])),
        consumer_ms=consumer_ms,
        consumer_cpu_ms=consumer_ms if (consumer.kind, consumer.device) in CPU_CONSUMERS else 0.0,
        batch_size=first.key.batch_size,
        usable_cores=int(first.host.usable_cores),
        source="workers=0" if serial else f"CPU time in workers={first.summary.workers}",
    )


def _ranks(result: JobResult) -> int:
    return result.summary.ranks or 1


def worker_kind_of(result: JobResult) -> str:
    """THREADS for a job whose workers were threads (a thread backend, workers > 0), else PROCESSES."""
    backend = loader_settings(result).backend
    return BACKEND_WORKER_KINDS.get(backend, PROCESSES) if result.key.workers > 0 else PROCESSES


# Where _advice_dominant says a chain's costliest step was measured when a workers=0 job timed it.
SERIAL_WHERE = "at workers=0"


def _advice_dominant(base: str, results: Sequence[JobResult]) -> List[str]:
    """The advice line naming a chain's costliest step, from its workers=0 job, else from a watched
    loader's rows at its own worker count, and where it was measured."""
    serial = [r for r in results if r.key.workers == 0 and r.transform_rows]
    timed = serial or [r for r in results if watched(r) and r.transform_rows]
    if not timed:
        return [f"{base}: no workers=0 job, so no per-transform split; add workers=0 to the sweep to get one."]
    top = max(timed[0].transform_rows, key=lambda t: t.ms_per_sample)
    where = SERIAL_WHERE if serial else f"inside its {timed[0].key.workers} workers"
    cost = f"{format_value(top.ms_per_sample)} ms of each sample ({format_value(top.share_pct)}% of the chain {where})"
    # A job's load row is its dataset's fetch; a watched loader's is the user's whole __getitem__.
    if top.stage == LOAD_STAGE and where == SERIAL_WHERE and not any(watched(r) for r in results):
        io = next((r.summary.io_share_of_load_pct for r in results if r.key.workers == 0), None)
        reads = f"; {format_value(float(io))}% of it in file reads" if io is not None and math.isfinite(io) else ""
        return [f"Dominant cost in {base}: the dataset's read ({top.transform}: fetching and unpacking each sample "
                f"from its storage), {cost}{reads}. It is the storage's cost, not the chain's: no transform change "
                "touches it. Faster or warmer storage (dataset.cache), a layout that reads less a sample, or workers "
                "reading side by side make it cheaper."]
    if top.stage == DECODE_STAGE:
        return [f"Dominant cost in {base}: the image decode, {cost}. No transform can make it cheaper: decode less. "
                "`pipebench explore` tries the decode moves: a reduced-size decode (JPEG DCT scaling) when the crop is "
                "resized down, and a faster decoder."]
    return [f"Dominant cost in {base}: {top.transform}, {cost}. Make it cheaper first."]


def _advice_workers(base: str, costs: ChainCosts) -> List[str]:
    ceiling = 1000.0 * costs.usable_cores / (costs.cpu_ms_per_sample + costs.consumer_cpu_ms / costs.batch_size)
    if costs.consumer_ms <= 0:
        return [f"No consumer was measured with {base} (consumer=none): {costs.usable_cores} usable core(s) at "
                f"{format_value(costs.cpu_ms_per_sample)} ms of CPU a sample cap the loader at "
                f"{format_value(ceiling)} samples/s; workers beyond {costs.usable_cores} only time-slice."]
    consumer_rate = 1000.0 * costs.batch_size / costs.consumer_ms
    needed = workers_to_feed(costs)
    if needed is not None:
        return [f"Workers: {needed} worker(s) should feed the consumer ({format_value(consumer_rate)} samples/s) "
                f"with {base}; more than that buys nothing but memory and start-up time."]
    target_ms = costs.usable_cores * costs.consumer_ms / costs.batch_size - costs.consumer_cpu_ms / costs.batch_size
    return [f"Workers cannot fix this on this machine: {costs.usable_cores} usable core(s) at "
            f"{format_value(costs.cpu_ms_per_sample)} ms of CPU a sample cap the loader at {format_value(ceiling)} samples/s, "
            f"below the consumer's {format_value(consumer_rate)}. Cut the per-sample cost to about "
            f"{format_value(target_ms)} ms, or add cores; workers beyond {costs.usable_cores} only time-slice."]


@dataclass(frozen=True)
class Figure:
    """One figure of a chain that a swept axis moves: its value and relative ~95% half-width."""

    name: str
    value: float
    noise: float
    lower_is_better: bool


def _noise_of_rounds(values: Sequence[float], floor: float) -> float:
    """Relative half-width from the spread across rounds, never below `floor`."""
    median = float(np.median(values))
    spread = compare_half_width(values) / median if len(values) > 1 and median else float("nan")
    return max(spread, floor) if math.isfinite(spread) else floor


def _per_step_figure(name: str, results: Sequence[JobResult], series) -> Optional[Figure]:
    """The median of a per-step series over every measured step, with its notch half-width."""
    values = np.array([v for r in results for p in r.pass_records for v in series(p)], dtype=np.float64)
    if values.size == 0:
        return None
    median = float(np.median(values))
    iqr = float(np.subtract(*np.percentile(values, [75, 25])))
    noise = MEDIAN_NOTCH * iqr / math.sqrt(values.size) / median if median > 0 else float("nan")
    return Figure(name, median, noise if math.isfinite(noise) else 0.0, lower_is_better=True)


def _consumer_step_figure(results: Sequence[JobResult]) -> Optional[Figure]:
    """The consumer's host ms a step (its copy aside), over every measured step."""
    return _per_step_figure("consumer ms a step", results, lambda p: p.compute_ms)


def _cpu_figure(results: Sequence[JobResult]) -> Figure:
    serial = [r for r in results if r.key.workers == 0] or results
    values = [r.summary.cpu_ms_per_sample for r in serial]
    return Figure("CPU ms a sample", float(np.median(values)), _noise_of_rounds(values, CPU_COST_NOISE_FLOOR), True)


def _rate_figure(results: Sequence[JobResult], workers: int) -> Figure:
    same = [r.summary for r in results if r.key.workers == workers]
    rates = [s.samples_per_s for s in same]
    if len(rates) > 1:
        noise = _noise_of_rounds(rates, 0.0)
    else:
        low, high = nan_if_none(same[0].samples_per_s_ci_low), nan_if_none(same[0].samples_per_s_ci_high)
        within = (high - low) / 2 / rates[0] if rates[0] and math.isfinite(high - low) else 0.0
        noise = max(within, RUN_TO_RUN_RATE_FLOOR)
    return Figure(f"samples/s at workers={workers}", float(np.median(rates)), noise, lower_is_better=False)


def swept_axis(keys: Sequence[str]) -> str:
    """Which axis two chains differ along, by the first AXIS_PREFIXES entry any differing key matches."""
    for axis, prefixes in AXIS_PREFIXES:
        if any(key == prefix or key.startswith(prefix + ".") for key in keys for prefix in prefixes):
            return axis
    return AXIS_CHAIN


def _axis_between(base: JobResult, other: JobResult) -> str:
    """The axis two jobs' chains differ along (`swept_axis` of the override keys they set differently)."""
    base_keys, keys = _chain_overrides(base), _chain_overrides(other)
    return swept_axis([k for k in set(base_keys) | set(keys) if base_keys.get(k) != keys.get(k)])


def axis_figures(axis: str, base: Sequence[JobResult], other: Sequence[JobResult]) -> List[Tuple[Figure, Figure]]:
    """(base, other) figures that `axis` moves; see the table in the module doc of `_advice_variants`."""
    if axis == AXIS_CONSUMER:
        pairs = [(_consumer_step_figure(base), _consumer_step_figure(other))]
    elif axis == AXIS_PIN_MEMORY:
        pairs = [tuple(_per_step_figure(name, rs, series) for rs in (base, other)) for name, series in (
            ("H2D ms a step", lambda p: p.h2d_ms),
            ("main-process ms a step", lambda p: [g + h for g, h in zip(p.gap_ms, p.h2d_ms)]))]
    elif axis == AXIS_LOADER:
        common = sorted({r.key.workers for r in base} & {r.key.workers for r in other})
        pairs = [(_rate_figure(base, common[-1]), _rate_figure(other, common[-1]))] if common else []
    else:
        pairs = [(_cpu_figure(base), _cpu_figure(other))]
    return [(b, o) for b, o in pairs if b is not None and o is not None]


@dataclass(frozen=True)
class Verdict:
    """How much better `other` is (>1: better), and whether that clears both sides' noise."""

    figure: str
    base: float
    other: float
    ratio: float
    noise: float

    @property
    def claim(self) -> str:
        if not math.isfinite(self.noise) or abs(self.ratio - 1) <= self.noise:
            return WITHIN_NOISE
        return PAYS if self.ratio > 1 else DOES_NOT_PAY

    def text(self) -> str:
        return (f"{self.figure} {format_value(self.other)} against {format_value(self.base)} ({self.ratio:.2f}x, "
                f"noise ±{100 * self.noise:.0f}%)")


def verdict(base: Figure, other: Figure) -> Verdict:
    """`other` against `base`; the noise is the two sides' relative half-widths in quadrature."""
    ratio = base.value / other.value if base.lower_is_better else other.value / base.value
    return Verdict(base.name, base.value, other.value, ratio, math.hypot(base.noise, other.noise))


def _advice_variants(base: str, groups: Mapping[str, Sequence[JobResult]],
                     costs: Mapping[str, ChainCosts]) -> List[str]:
    """Each chain against the base, by the figure its swept axis moves, with a claim only above the noise.

    | swept axis | compared by |
    | consumer | consumer ms a step (and syncs a step where measured) |
    | loader.pin_memory | H2D ms and the main process's own ms a step |
    | other loader settings | samples/s at the largest worker count both ran |
    | transform chain, dataset | CPU ms a sample (what the cores' budget is spent on; load moves it least) |
    """
    others = [chain for chain in groups if chain != base]
    if not others and all(watched(r) for r in groups[base]):
        return ["Variants: `pipebench attach --export-config DIR -- python train.py ...` writes this loader's "
                "dataset, transform and loader configs; `pipebench explore --config-dir DIR` then measures its "
                "variants."]
    if not others:
        return ["Reordering and batching: only one chain was measured; `pipebench explore` measures the variants."]
    paying, losing, unclear = [], [], []
    for chain in others:
        axis = _axis_between(groups[base][0], groups[chain][0])
        verdicts = [verdict(b, o) for b, o in axis_figures(axis, groups[base], groups[chain])]
        if not verdicts:
            continue
        claims = {v.claim for v in verdicts}
        detail = "; ".join(v.text() for v in verdicts) + _syncs_text(axis, groups[base], groups[chain])
        if PAYS in claims and DOES_NOT_PAY not in claims:
            best = ""
            if axis == AXIS_CHAIN:
                other = costs[chain]
                rate = max(predict(other, w).samples_per_s for w in range(0, 2 * other.usable_cores + 1))
                best = f"; predicted best {format_value(rate)} samples/s on this machine"
            paying.append((verdicts[0].ratio, f"{chain} pays against {base}: {detail}{best}."))
        elif DOES_NOT_PAY in claims and PAYS not in claims:
            losing.append(f"{chain} does not pay against {base}: {detail}.")
        else:
            unclear.append(f"{chain} ({detail})")
    lines = [text for _, text in sorted(paying, key=lambda item: item[0], reverse=True)] + losing
    if unclear:
        lines.append(f"Within the noise against {base}, so no claim: " + ", ".join(unclear) + ".")
    return lines


def _syncs_text(axis: str, base: Sequence[JobResult], other: Sequence[JobResult]) -> str:
    """Syncs a step beside a consumer's time, where the GPU probe measured them (exact counts, no noise)."""
    if axis != AXIS_CONSUMER or any(r.summary.syncs_per_step is None for r in (*base, *other)):
        return ""
    counts = [np.median([r.summary.syncs_per_step for r in rs]) for rs in (base, other)]
    return f"; syncs a step {format_value(float(counts[1]))} against {format_value(float(counts[0]))}"


def _advice_shared_interpreter(base: str, groups: Mapping[str, Sequence[JobResult]],
                               threaded: Set[str]) -> List[str]:
    """Thread-backend chains whose training step itself ran slower than the base's worker-process one, the
    two differing only in loader settings: samples/s counts that cost, but only this line names it (the
    toy CNN's step took 31.3 ms beside 8 loader threads against 17.8 beside 8 processes on a 16-core host)."""
    if base in threaded or groups[base][0].consumer_report.kind == NO_CONSUMER:
        return []
    base_step = _consumer_step_figure(groups[base])
    lines = []
    for chain in (c for c in groups if c in threaded):
        if _axis_between(groups[base][0], groups[chain][0]) != AXIS_LOADER:
            continue
        step = _consumer_step_figure(groups[chain])
        slower = verdict(base_step, step) if base_step is not None and step is not None else None
        if slower is None or slower.claim != DOES_NOT_PAY:
            continue
        lines.append(f"{chain} slows the training step itself: {slower.text()}. Its loader "
                     "threads share the main process's interpreter (the GIL) with the training loop's Python, "
                     f"so each step waits for it; under {base} the workers are processes of their own.")
    return lines


def _advice_epochs(results: Sequence[JobResult]) -> List[str]:
    """Jobs whose workers restart at every epoch end for more than RESTART_SHARE_WORTH_NAMING of an epoch."""
    lines = []
    for label, result in zip(chain_labels(results), results):
        summary = result.summary
        steady, epoch = summary.samples_per_s, summary.samples_per_s_epoch
        if summary.workers == 0 or not steady or epoch is None or not math.isfinite(epoch):
            continue
        share = 1.0 - epoch / steady
        if share > RESTART_SHARE_WORTH_NAMING and not loader_settings(result).persistent_workers:
            lines.append(f"{label} at workers={summary.workers}: restarting the workers at each epoch end costs "
                         f"{format_value(summary.epoch_restart_s)} s, {100 * share:.0f}% of an epoch "
                         f"({format_value(epoch)} samples/s an epoch against {format_value(steady)} "
                         "between ends); loader.persistent_workers=true keeps them.")
    return lines


def _advice_coverage(results: Sequence[JobResult]) -> List[str]:
    """The exactly-once check (result.json's `coverage`): a line a job that read a sample twice or missed
    one that drop_last does not explain, and one line for the jobs whose every miss is a last batch
    loader.drop_last=true dropped, the known loss the check does not count."""
    failed, dropped = [], []
    for label, result in zip(chain_labels(results), results):
        coverage = sections_of(result).coverage_report
        if coverage is None:
            continue
        where = f"{label} at workers={result.key.workers}"
        if coverage.duplicates or coverage.missing:
            found = [f"{coverage.duplicates} duplicate reads (e.g. {list(coverage.duplicate_examples)})"
                     if coverage.duplicates else "",
                     f"{coverage.missing} missed samples that drop_last does not explain (e.g. "
                     f"{list(coverage.missing_examples)})" if coverage.missing else ""]
            failed.append(f"Exactly-once check failed, {where}: {' and '.join(f for f in found if f)} in "
                          f"{coverage.complete_epochs} finished epoch(s): readers that share or skip samples (a "
                          "missing DistributedSampler, a stream not split with get_worker_info()).")
        elif coverage.dropped_last and coverage.complete_epochs:
            dropped.append(f"{where} ({format_value(coverage.dropped_last / coverage.complete_epochs)} "
                           "samples an epoch)")
    if dropped:
        failed.append(f"Exactly once but for the last batch: {', '.join(dropped)} read every sample index once an "
                      "epoch except the last partial batch each reader drops under loader.drop_last=true, a known "
                      "loss and no failure of the check; loader.drop_last=false reads them.")
    return failed


def _lone_tail(result: JobResult) -> Optional[str]:
    """What the job's window measured of a lone tail: at its first epoch end, the last batches that came
    from one worker alone, when there are LONE_TAIL_MIN_STEPS of them or more; None otherwise (no epoch
    end in the window, or the workers finished together)."""
    for record in result.pass_records:
        epochs, workers, step_ms = record.epoch, record.worker_id, record.step_ms
        for end in (i for i in range(1, len(epochs)) if epochs[i] != epochs[i - 1]):
            start, first = epochs.index(epochs[end - 1]), end - 1
            while first > start and workers[first - 1] == workers[end - 1]:
                first -= 1
            if end - first >= LONE_TAIL_MIN_STEPS:
                return (f"measured ({result.job}): the last {end - first} batches of epoch {epochs[end - 1]} came "
                        f"from worker {workers[end - 1]} alone, {format_value(sum(step_ms[first:end]) / 1000)} s of "
                        f"the epoch's {format_value(sum(step_ms[start:end]) / 1000)} s in the window")
    return None


def _shard_count(jobs: Sequence[JobResult]) -> Optional[int]:
    """The shards of the jobs' sharded dataset (its identity's `shards`); None for a dataset that is not
    sharded, or jobs that disagree."""
    shards = {result.host.dataset_facts.shards for result in jobs}
    return int(shards.pop()) if len(shards) == 1 and None not in shards else None


def _single_rank_shards(jobs: Sequence[JobResult]) -> Optional[int]:
    """The shard count that caps one rank's reading workers (`_shard_count`), for single-rank jobs."""
    return _shard_count(jobs) if all(_ranks(j) == 1 for j in jobs) else None


def _busy_readers(jobs: Sequence[JobResult], ranks: int, workers: int) -> Optional[int]:
    """The readers of `ranks` x `workers` that get a shard of the jobs' sharded dataset (its identity's
    `shards`); None for a dataset that is not sharded, whose every reader reads."""
    shards = _shard_count(jobs)
    if shards is None:
        return None
    return ranks * max(workers, 1) - len(idle_readers(shards, ranks, workers))


def _advice_idle_shards(results: Sequence[JobResult]) -> List[str]:
    """Jobs whose sharded dataset (its identity's `shards`) leaves readers idle, with fewer shards than
    ranks x workers, or one reader reading alone at the epoch's end, with uneven shards (its
    `shard_samples`); the lone tail as measured where a job's window holds an epoch end."""
    lines: Dict[str, Optional[str]] = {}
    for result in results:
        dataset = result.host.dataset_facts
        if dataset.shards is None:
            continue
        ranks, workers = _ranks(result), result.key.workers
        lines.setdefault(idle_line(dataset.name, int(dataset.shards), ranks, workers), None)
        uneven = uneven_line(dataset.name, dataset.shard_samples, ranks, workers) if dataset.shard_samples else ""
        if uneven and lines.get(uneven) is None:
            lines[uneven] = _lone_tail(result) if workers > 1 else None
    return [f"{line}; {measured}" if measured else line for line, measured in lines.items() if line]


def _advice_random_access(results: Sequence[JobResult]) -> List[str]:
    """Map-style row-group datasets (Parquet) read under a shuffling sampler, one line a dataset, with the
    median bytes its jobs read a sample where their read figures have them (pipebench/model/shards.py)."""
    jobs: Dict[str, List[JobResult]] = {}
    for result in results:
        if loader_settings(result).shuffle:
            jobs.setdefault(repr(sorted(result.host.dataset.items())), []).append(result)
    lines = []
    for same in jobs.values():
        read = [r.summary.read_bytes_per_sample for r in same if r.summary.read_bytes_per_sample]
        lines.append(random_access_line(same[0].host.dataset, True,
                                        float(np.median(read)) if read else None))
    return [line for line in lines if line]


def _inflated_cpu(off: Sequence[PredictedRow], costs: Mapping[str, ChainCosts]) -> List[str]:
    """Measured evidence first: rows whose samples cost more CPU inside workers than in one process."""
    lines = []
    for row in off:
        base = costs[row.chain]
        ratio = row.measured_cpu_ms_per_sample / base.cpu_ms_per_sample
        if row.workers > 0 and ratio >= WORKER_CPU_INFLATION:
            ceiling = 1000.0 * base.usable_cores / row.measured_cpu_ms_per_sample
            lines.append(f"{row.chain} at workers={row.workers}: a sample took {format_value(row.measured_cpu_ms_per_sample)}"
                         f" ms of CPU inside workers against {format_value(base.cpu_ms_per_sample)} in one process "
                         f"(+{100 * (ratio - 1):.0f}%: contended caches and memory bandwidth, time-sliced collates); "
                         f"at that cost the cores allow {format_value(ceiling)} samples/s.")
    return lines


def _advice_threads(rows: Sequence[PredictedRow]) -> List[str]:
    """One line naming the rows the model leaves unpredicted because their workers were threads."""
    named = [f"{r.chain} at workers={r.workers}" for r in rows if r.predicted is None]
    if not named:
        return []
    return [f"Not predicted: {', '.join(named)}. Their workers are threads of one process (loader.backend=threads "
            "or spdl), and the model's W/c assumes worker processes: threads share the GIL, so W threads reach W/c "
            "only on steps that release it (decode_jpeg, PIL's decoder, torch ops). Read their measured samples/s, "
            "worker_capacity_samples_per_s and process_cpu_ms_per_sample instead, and the thread-scaling profile "
            "(transforms.csv: thread_speedups, thread_verdict) for which steps scale; workers and cores are sized "
            "for worker processes only."]


def _advice_unexplained(rows: Sequence[PredictedRow], results: Sequence[JobResult],
                        costs: Mapping[str, ChainCosts]) -> List[str]:
    off = [r for r in rows if r.predicted is not None and abs(r.gap) > EXPLAINED_WITHIN]
    if not off:
        return [f"Unexplained: nothing beyond {format_value(100 * EXPLAINED_WITHIN)}%; the model accounts for "
                f"every measured row."]
    worker_jobs = [r.summary for r in results if r.key.workers > 0]
    candidates = []
    if worker_jobs:
        transfer = np.nanmedian([s.transfer_ms_median for s in worker_jobs])
        ready = np.nanmedian([s.ready_next_ms_median for s in worker_jobs]) if any(
            not math.isnan(s.ready_next_ms_median) for s in worker_jobs) else float("nan")
        done = (f"{format_value(float(ready))} ms a next() took for a batch already done, the delivery alone: "
                "unpickling and the shared-memory rebuild" if math.isfinite(ready) else
                "no batch was done before next() asked for it")
        candidates.append(f"batch delivery from workers (median {format_value(float(transfer))} ms a batch from a "
                          "worker finishing it (its collate done) to the main loop holding it: its wait in the "
                          f"queue and the in-order buffer behind earlier batches, then the IPC; {done})")
    if any(sections_of(r).pin_memory_effective for r in results):
        candidates.append("pin-memory copies (pin_memory=true)")
    if any(r.predicted.bound == "cores" for r in off):
        candidates.append("cores that are SMT siblings or shared with other tenants (the model counts each "
                          "usable core as a whole one)")
    candidates.append("the collate and the main loop's bookkeeping")
    if any(r.ranks > 1 for r in off):
        candidates.append("waiting at the all-reduce for the slowest rank (see straggler_ratio and "
                          "collective_wait_ms_mean)")
    named = ", ".join(f"{r.chain} at {f'ranks={r.ranks} ' if r.ranks > 1 else ''}workers={r.workers} "
                      f"({format_value(100 * r.gap)}%)" for r in off)
    return [f"Off the model by more than {format_value(100 * EXPLAINED_WITHIN)}%: {named}. "
            f"The model leaves out {'; '.join(candidates)}.", *_inflated_cpu(off, costs)]


def _items(numbers: Sequence[int]) -> str:
    """'item 5', 'items 5 and 6', 'items 4, 5 and 6'."""
    if len(numbers) == 1:
        return f"item {numbers[0]}"
    return f"items {', '.join(map(str, numbers[:-1]))} and {numbers[-1]}"


def _with_cap_gap(advice: Sequence[str], cap: Sequence[str], unexplained: Sequence[str], base: str,
                  rows: Sequence[PredictedRow], costs: Mapping[str, ChainCosts]) -> List[str]:
    """`advice` with the cores' cap line (`cap`, from _advice_workers) saying how far the best measured
    rate the cap binds fell below it, past CAP_GAP_WORTH_NAMING, and which items explain that:
    the CPU measured inside workers (_inflated_cpu), else none, and the model's candidates
    (`unexplained`'s first line)."""
    capped = [r for r in rows if r.chain == base and r.predicted is not None and r.predicted.bound == "cores"]
    best = max(capped, key=lambda r: r.measured_samples_per_s, default=None)
    if not cap or best is None or -best.gap <= CAP_GAP_WORTH_NAMING:
        return list(advice)
    number = {line: i for i, line in enumerate(advice, 1)}
    evidence = [number[line] for line in _inflated_cpu([r for r in capped if abs(r.gap) > EXPLAINED_WITHIN], costs)
                if line in number]
    listed = f"{_items([number[unexplained[0]]])} lists what the model leaves out"
    why = (f"{_items(evidence)} measure{'s' if len(evidence) == 1 else ''} the CPU a sample costs inside workers "
           f"and the cap at that cost; {listed}" if evidence else
           f"unexplained, no measured figure accounts for it; {listed}")
    gap = (f" The best measured, {format_value(best.measured_samples_per_s)} samples/s at "
           f"{f'ranks={best.ranks} ' if best.ranks > 1 else ''}workers={best.workers}, is {100 * -best.gap:.0f}% below "
           f"this cap: {why}.")
    return [line + gap if line is cap[0] else line for line in advice]


def _advice_gil_disagreement(groups: Mapping[str, Sequence[JobResult]], threaded: Set[str]) -> List[str]:
    """Where a thread-backend chain and a worker-process one that differ in loader settings only are told
    apart at their largest common worker count (the one rule, pipebench.model.judging) and the winner contradicts
    the thread-scaling profile: threads win although steps hold the GIL, or lose although none does."""
    lines = []
    for chain, other in ((c, o) for c in groups if c in threaded for o in groups if o not in threaded):
        common = {r.key.workers for r in groups[chain]} & {r.key.workers for r in groups[other]}
        if _axis_between(groups[other][0], groups[chain][0]) != AXIS_LOADER or not common - {0}:
            continue
        workers = max(common)
        threads, processes = ([r for r in groups[c] if r.key.workers == workers] for c in (chain, other))
        if not any(sections_of(r).thread_profile for r in (*threads, *processes)):
            continue
        spread_t, spread_p = measured_rate(threads), measured_rate(processes)
        held = gil_bound_steps([*threads, *processes])
        won = spread_t.value > spread_p.value
        if won != bool(held) or judged(spread_t, spread_p) != APART:
            continue
        outcome = (f"{chain} {'beats' if won else 'loses to'} {other} at workers={workers} "
                   f"({format_value(spread_t.value)} against {format_value(spread_p.value)} samples/s, "
                   f"{spread_t.value / spread_p.value:.2f}x, beyond the noise)")
        profile = (f"the thread-scaling profile says {', '.join(held)} hold{'s' if len(held) == 1 else ''} the GIL"
                   if won else "the thread-scaling profile finds no step that holds the GIL")
        cost = ("what worker processes pay and threads do not (pickling each batch, the IPC, worker start-up) "
                "outweighed the queue for the GIL" if won else
                "what threads share with the rest of the loop (the collate, the main loop and the consumer's "
                "Python, on one interpreter) cost more than the processes' IPC and pickling")
        lines.append(f"{outcome}, although {profile}. The two measure different things: the profile calls the "
                     "chain's steps alone, one step at a time on k threads with nothing else running; the backend "
                     f"runs the whole loop, where {cost}. The measured samples/s is what this loop gets on this host.")
    return lines


def whole_chain_timed(result: JobResult) -> bool:
    """Whether a result's transform rows hold a sample's whole cost, as the model needs: a job's
    always do; a watched loader's (`pipebench attach`, `pipebench.watch`) only with its `load` row,
    the dataset's own __getitem__ outside the recipe. The user's step is then the consumer, taken
    as using none of the loader's cores (its CPU time is not known)."""
    return bool(result.transform_rows) and (not watched(result) or any(t.stage == LOAD_STAGE
                                                                          for t in result.transform_rows))


def diagnose(results: Sequence[Mapping]) -> Diagnosis:
    """Predict every measured (chain, workers) and write the advice; `results` are the loader's
    `JobResult`s, or result.json mappings (read as records)."""
    results = [JobResult.read(r) for r in results]
    groups: Dict[str, List[JobResult]] = {}
    for label, result in zip(chain_labels(results), results):
        groups.setdefault(label, []).append(result)
    costs = {chain: chain_costs(jobs) for chain, jobs in groups.items()}
    rows = []
    for chain, jobs in groups.items():
        places: Dict[Tuple[int, int, str], list] = {}
        for job in jobs:
            places.setdefault((_ranks(job), job.key.workers, worker_kind_of(job)), []).append(job.summary)
        for (ranks, workers, kind), same in sorted(places.items()):
            rows.append(PredictedRow(
                chain=chain, ranks=ranks, workers=workers,
                predicted=predict(costs[chain], workers, ranks, _busy_readers(jobs, ranks, workers))
                if kind == PROCESSES else None,
                measured_samples_per_s=float(np.median([s.samples_per_s for s in same])),
                measured_starvation_pct=float(np.median([s.starvation_pct for s in same])),
                measured_cpu_ms_per_sample=float(np.median([s.cpu_ms_per_sample for s in same]))))
    threaded = {chain for chain, jobs in groups.items() if any(worker_kind_of(j) == THREADS for j in jobs)}
    base = next(iter(groups))
    cap = _advice_workers(base, costs[base]) if base not in threaded else []
    unexplained = _advice_unexplained(rows, results, costs)
    advice = [*_advice_dominant(base, groups[base]), *cap,
              *_advice_variants(base, groups, costs), *_advice_shared_interpreter(base, groups, threaded),
              *_advice_epochs(results), *_advice_coverage(results), *gil_lines(results), *_advice_gil_disagreement(groups, threaded),
              *_advice_idle_shards(results), *_advice_random_access(results),
              *_advice_threads(rows), *unexplained]
    advice = _with_cap_gap(advice, cap, unexplained, base, rows, costs)
    # The first job's run.target_accel_util_pct (its default where the results predate the setting).
    target = float(run_settings(results[0]).target_accel_util_pct)
    targets = tuple((chain, needs_for_target(c, target, _single_rank_shards(groups[chain])))
                    for chain, c in costs.items() if c.consumer_ms > 0 and chain not in threaded)
    return Diagnosis(rows=tuple(rows), costs=tuple(costs.items()), advice=tuple(advice), targets=targets)


# The model's cells: numbers, or NOT_PREDICTED; right-aligned either way.
PREDICTED_COLUMNS = ("predicted_samples_per_s", "gap_pct", "predicted_starvation_pct")
PREDICTION_COLUMNS = ["chain", "ranks", "workers", "predicted_samples_per_s", "measured_samples_per_s", "gap_pct",
                      "predicted_starvation_pct", "measured_starvation_pct", "bound"]


def prediction_table_rows(diagnosis: Diagnosis) -> List[Dict[str, object]]:
    """One row a (chain, ranks, workers); NOT_PREDICTED in the model's cells where it does not apply."""
    rows: List[Dict[str, object]] = []
    for r in diagnosis.rows:
        row: Dict[str, object] = {"chain": r.chain, "ranks": r.ranks, "workers": r.workers,
                                  "measured_samples_per_s": r.measured_samples_per_s,
                                  # Percentages to one decimal: the machine's run-to-run noise is several percent.
                                  "measured_starvation_pct": round(r.measured_starvation_pct, 1)}
        if r.predicted is None:
            row.update(dict.fromkeys(PREDICTED_COLUMNS, NOT_PREDICTED), bound=THREADS_BOUND)
        else:
            row.update(predicted_samples_per_s=r.predicted.samples_per_s, gap_pct=round(100.0 * r.gap, 1),
                       predicted_starvation_pct=round(r.predicted.starvation_pct, 1), bound=r.predicted.bound)
        rows.append(row)
    return rows


def render_diagnosis(diagnosis: Diagnosis) -> str:
    """Markdown: the costs the model used, prediction beside measurement, then what to do."""
    cost_rows = [{"chain": chain, "ms_per_sample": c.ms_per_sample, "cpu_ms_per_sample": c.cpu_ms_per_sample,
                  "consumer_ms_per_step": c.consumer_ms,
                  "batch_size": c.batch_size, "usable_cores": c.usable_cores, "measured_at": c.source}
                 for chain, c in diagnosis.costs]
    parts = [
        "## diagnosis\n",
        "Model: workers=0 runs B·c + s a step; with W workers the rate is the least of W/c, "
        "cores/(c_cpu + consumer CPU/B) and the consumer's B/s (c, c_cpu = wall and CPU ms a sample at "
        "workers=0; s = consumer ms a step). R ranks multiply the per-rank limits and share the cores. "
        "W/c assumes worker processes: rows whose workers are threads (loader.backend=threads, spdl) are not "
        "predicted.\n",
        markdown_table(cost_rows, list(cost_rows[0])),
        markdown_table(prediction_table_rows(diagnosis), [c for c in PREDICTION_COLUMNS if c != "ranks" or any(
            r.ranks > 1 for r in diagnosis.rows)], right=PREDICTED_COLUMNS),
        *([f"### cores for accel_util_pct ≥ {format_value(diagnosis.targets[0][1].target_pct)}% "
           "(run.target_accel_util_pct)\n",
           "\n".join(f"- {target_line(chain, needs)}" for chain, needs in diagnosis.targets) + "\n"]
          if diagnosis.targets else []),
        "### what to do\n",
        "\n".join(f"{i}. {line}" for i, line in enumerate(diagnosis.advice, 1)) + "\n",
    ]
    return "\n".join(parts)
