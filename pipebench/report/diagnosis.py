"""Diagnosis: predict samples/s and starvation from single-process costs, and say what to change.

The model is the one an engineer does on a napkin. A chain takes ``c`` ms a sample of wall
time and ``c_cpu`` ms of CPU time (measured at workers=0, where nothing competes; they differ
by the I/O waits), the consumer takes ``s`` ms a step of B samples, and the machine has C
usable cores:

- workers=0: the main process does both in turn, so a step is B·c + s;
- W workers: each worker makes at most 1/c samples a ms, all of them together at most
  C / (c_cpu + s_cpu/B), the cores' budget once the consumer's own CPU share s_cpu is paid
  (zero for a consumer that sleeps or runs on a GPU), and the consumer eats at most B/s.
  Throughput is the least of the three; starvation is 1 − throughput / consumer rate.
- R ranks (distributed.nproc): each rank has its own loader and consumer, so the per-rank
  limits multiply by R, while the cores' budget is shared by all of them.

What the model leaves out (collate and IPC delivery, pin-memory, the main loop's own
bookkeeping, page cache) is what the gap between prediction and measurement is made of, so
the report prints both side by side and names the candidates.
"""

import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from pipebench.base.tables import format_value, markdown_table

# Overrides that never define a chain: the axis the model predicts along, and repetition.
NON_CHAIN_KEYS = ("workers", "distributed.nproc", "run.round", "results_dir")
# A measurement within this of the prediction is explained by the model; shared 2-core machines
# wobble by up to ~15% between back-to-back runs (benchmarks/overhead.py's A/A spread).
EXPLAINED_WITHIN = 0.15
# A variant must beat the base chain's per-sample cost by this much to be worth recommending;
# below it the difference is within the per-transform timings' own run-to-run noise.
WORTHWHILE_SPEEDUP = 1.05
# CPU a sample inside workers this much above the single-process figure is worth naming: below
# it the difference is within the per-sample timings' run-to-run noise.
WORKER_CPU_INFLATION = 1.05
# Consumers that spend main-process CPU while they run (the others sleep or wait on a GPU).
CPU_CONSUMERS = {("toy_cnn", "cpu")}


@dataclass(frozen=True)
class ChainCosts:
    """What the model needs of one chain, measured at workers=0 unless `source` says otherwise."""

    ms_per_sample: float
    cpu_ms_per_sample: float
    consumer_ms: float
    consumer_cpu_ms: float
    batch_size: int
    usable_cores: int
    source: str


@dataclass(frozen=True)
class Prediction:
    samples_per_s: float
    starvation_pct: float
    bound: str  # "serial", "consumer", "workers" or "cores": which limit sets the rate


@dataclass(frozen=True)
class PredictedRow:
    chain: str
    ranks: int
    workers: int
    predicted: Prediction
    measured_samples_per_s: float
    measured_starvation_pct: float
    measured_cpu_ms_per_sample: float
    jobs: int

    @property
    def gap(self) -> float:
        """Measured over predicted, minus one: negative when the pipeline falls short of the model."""
        return self.measured_samples_per_s / self.predicted.samples_per_s - 1.0


@dataclass(frozen=True)
class Diagnosis:
    rows: Tuple[PredictedRow, ...]
    costs: Tuple[Tuple[str, ChainCosts], ...]
    advice: Tuple[str, ...]


def _rate(amount: float, cost_ms: float) -> float:
    """amount / cost_ms in samples a ms; a cost too small to time limits nothing."""
    return amount / cost_ms if cost_ms > 0 else math.inf


def predict(costs: ChainCosts, workers: int, ranks: int = 1) -> Prediction:
    """Samples/s (all ranks together) and starvation % of `costs` with `workers` DataLoader workers
    in each of `ranks` ranks (see the module doc)."""
    batch, c, s = costs.batch_size, costs.ms_per_sample, costs.consumer_ms
    consumer = _rate(ranks * batch, s)
    limits = {"serial": _rate(ranks * batch, batch * c + s)} if workers == 0 else {
        "consumer": consumer,
        "workers": _rate(ranks * workers, c),
    }
    limits["cores"] = _rate(costs.usable_cores, costs.cpu_ms_per_sample + costs.consumer_cpu_ms / batch)
    bound = min(limits, key=limits.get)
    rate = limits[bound]  # samples a ms
    starvation = 100.0 * (1.0 - rate / consumer) if s > 0 else 100.0
    return Prediction(1000.0 * rate, max(starvation, 0.0), bound)


def workers_to_feed(costs: ChainCosts) -> Optional[int]:
    """The fewest workers whose output matches the consumer's appetite, or None if the cores can't."""
    if costs.consumer_ms <= 0:
        return None
    needed = math.ceil(costs.ms_per_sample * costs.batch_size / costs.consumer_ms)
    feeds = predict(costs, needed).bound == "consumer"
    return needed if feeds else None


def _chain_overrides(result: Mapping) -> Dict[str, str]:
    pairs = (o.split("=", 1) for o in result.get("overrides", []) if "=" in o)
    return {key.lstrip("+~"): value for key, value in pairs if key.lstrip("+~") not in NON_CHAIN_KEYS}


def chain_labels(results: Sequence[Mapping]) -> List[str]:
    """Each job's chain: the overrides that differ between the jobs, less the worker count and the
    round (settings every job shares say nothing); `transform=NAME` when nothing differs."""
    overrides = [_chain_overrides(r) for r in results]
    keys = sorted({k for o in overrides for k in o})
    differing = [k for k in keys if len({o.get(k) for o in overrides}) > 1]
    return [",".join(f"{k}={o[k]}" for k in differing if k in o) or f"transform={r['summary']['transform']}"
            for o, r in zip(overrides, results)]


def _consumer_ms(result: Mapping) -> float:
    steps = [c + h for p in result["passes"] for c, h in zip(p["compute_ms"], p["h2d_ms"])]
    return float(np.median(steps)) if steps else float("nan")


def chain_costs(results: Sequence[Mapping]) -> ChainCosts:
    """One chain's costs, from its single-rank workers=0 jobs (median over rounds), else any workers=0
    job's, else its CPU time in workers."""
    serial = [r for r in results if r["summary"]["workers"] == 0 and _ranks(r) == 1] or \
        [r for r in results if r["summary"]["workers"] == 0]
    picked = serial or list(results)
    wall_key = "pipeline_ms_per_sample" if serial else "cpu_ms_per_sample"
    first = picked[0]
    consumer = first.get("consumer_report") or {}
    consumer_ms = float(np.median([_consumer_ms(r) for r in picked]))
    on_cpu = (consumer.get("kind"), consumer.get("device")) in CPU_CONSUMERS
    return ChainCosts(
        ms_per_sample=float(np.median([r["summary"][wall_key] for r in picked])),
        cpu_ms_per_sample=float(np.median([r["summary"]["cpu_ms_per_sample"] for r in picked])),
        consumer_ms=consumer_ms,
        consumer_cpu_ms=consumer_ms if on_cpu else 0.0,
        batch_size=int(first["summary"]["batch_size"]),
        usable_cores=int(first["fingerprint"]["usable_cores"]),
        source="workers=0" if serial else f"CPU time in workers={first['summary']['workers']}",
    )


def _ranks(result: Mapping) -> int:
    return int(result["summary"].get("ranks", 1))


def _group(results: Sequence[Mapping]) -> Dict[str, List[Mapping]]:
    groups: Dict[str, List[Mapping]] = {}
    for label, result in zip(chain_labels(results), results):
        groups.setdefault(label, []).append(result)
    return groups


def _dominant(results: Sequence[Mapping]) -> Optional[Tuple[str, float, float]]:
    """The costliest step of a chain's workers=0 job: (name, ms a sample, share %)."""
    serial = [r for r in results if r["summary"]["workers"] == 0 and r.get("transforms")]
    if not serial:
        return None
    top = max(serial[0]["transforms"], key=lambda t: t["ms_per_sample"])
    return top["transform"], top["ms_per_sample"], top["share_pct"]


def _advice_dominant(base: str, results: Sequence[Mapping]) -> List[str]:
    dominant = _dominant(results)
    if dominant is None:
        return [f"{base}: no workers=0 job, so no per-transform split; add workers=0 to the sweep to get one."]
    name, ms, share = dominant
    return [f"Dominant cost in {base}: {name}, {format_value(ms)} ms of each sample ({format_value(share)}% "
            f"of the chain at workers=0). Make it cheaper first."]


def _advice_workers(base: str, costs: ChainCosts) -> List[str]:
    consumer_rate = 1000.0 * costs.batch_size / costs.consumer_ms if costs.consumer_ms > 0 else math.inf
    ceiling = 1000.0 * costs.usable_cores / (costs.cpu_ms_per_sample + costs.consumer_cpu_ms / costs.batch_size)
    needed = workers_to_feed(costs)
    if needed is not None:
        return [f"Workers: {needed} worker(s) should feed the consumer ({format_value(consumer_rate)} samples/s) "
                f"with {base}; more than that buys nothing but memory and start-up time."]
    target_ms = costs.usable_cores * costs.consumer_ms / costs.batch_size - costs.consumer_cpu_ms / costs.batch_size
    return [f"Workers cannot fix this on this machine: {costs.usable_cores} usable core(s) at "
            f"{format_value(costs.cpu_ms_per_sample)} ms of CPU a sample cap the loader at {format_value(ceiling)} samples/s, "
            f"below the consumer's {format_value(consumer_rate)}. Cut the per-sample cost to about "
            f"{format_value(target_ms)} ms, or add cores; workers beyond {costs.usable_cores} only time-slice."]


def _advice_variants(base: str, costs: Mapping[str, ChainCosts]) -> List[str]:
    """The chains that beat the base's CPU cost a sample, best first; the ones that don't, in one line.

    CPU time, not wall time: it is what the cores' budget is spent on, and other load on a shared
    machine moves it far less than it moves wall time.
    """
    base_costs = costs[base]
    speedups = {chain: base_costs.cpu_ms_per_sample / other.cpu_ms_per_sample
                for chain, other in costs.items() if chain != base}
    if not speedups:
        return ["Reordering and batching: only one chain was measured; `pipebench explore` measures the variants."]
    lines = []
    for chain in sorted((c for c in speedups if speedups[c] >= WORTHWHILE_SPEEDUP), key=speedups.get, reverse=True):
        other = costs[chain]
        best = max(predict(other, w).samples_per_s for w in range(0, 2 * other.usable_cores + 1))
        lines.append(f"{chain} pays: {format_value(other.cpu_ms_per_sample)} ms of CPU a sample against "
                     f"{format_value(base_costs.cpu_ms_per_sample)} for {base} ({speedups[chain]:.2f}x); "
                     f"predicted best {format_value(best)} samples/s on this machine.")
    losers = [c for c in speedups if speedups[c] < WORTHWHILE_SPEEDUP]
    if losers:
        lines.append("Does not pay (under " f"{format_value(WORTHWHILE_SPEEDUP)}x cheaper a sample than {base}): "
                     + ", ".join(f"{c} ({speedups[c]:.2f}x)" for c in losers) + ".")
    return lines


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


def _advice_unexplained(rows: Sequence[PredictedRow], results: Sequence[Mapping],
                        costs: Mapping[str, ChainCosts]) -> List[str]:
    off = [r for r in rows if abs(r.gap) > EXPLAINED_WITHIN]
    if not off:
        return [f"Unexplained: nothing beyond {format_value(100 * EXPLAINED_WITHIN)}%; the model accounts for "
                f"every measured row."]
    worker_jobs = [r["summary"] for r in results if r["summary"]["workers"] > 0]
    candidates = []
    if worker_jobs:
        transfer = np.nanmedian([s["transfer_ms_median"] for s in worker_jobs])
        ready = np.nanmedian([s["ready_next_ms_median"] for s in worker_jobs]) if any(
            not math.isnan(s["ready_next_ms_median"]) for s in worker_jobs) else float("nan")
        candidates.append(f"batch delivery from workers (queue + IPC, median {format_value(float(transfer))} ms a "
                          f"batch; {format_value(float(ready))} ms when the batch was already done)")
    if any(r.get("pin_memory_effective") for r in results):
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


def diagnose(results: Sequence[Mapping]) -> Diagnosis:
    """Predict every measured (chain, workers) and write the advice; `results` are result.json dicts."""
    groups = _group(results)
    costs = {chain: chain_costs(jobs) for chain, jobs in groups.items()}
    rows = []
    for chain, jobs in groups.items():
        for ranks, workers in sorted({(_ranks(j), j["summary"]["workers"]) for j in jobs}):
            same = [j["summary"] for j in jobs if (_ranks(j), j["summary"]["workers"]) == (ranks, workers)]
            rows.append(PredictedRow(
                chain=chain, ranks=ranks, workers=workers, predicted=predict(costs[chain], workers, ranks),
                measured_samples_per_s=float(np.median([s["samples_per_s"] for s in same])),
                measured_starvation_pct=float(np.median([s["starvation_pct"] for s in same])),
                measured_cpu_ms_per_sample=float(np.median([s["cpu_ms_per_sample"] for s in same])),
                jobs=len(same),
            ))
    base = next(iter(groups))
    advice = [*_advice_dominant(base, groups[base]), *_advice_workers(base, costs[base]),
              *_advice_variants(base, costs), *_advice_unexplained(rows, results, costs)]
    return Diagnosis(rows=tuple(rows), costs=tuple(costs.items()), advice=tuple(advice))


PREDICTION_COLUMNS = ["chain", "ranks", "workers", "predicted_samples_per_s", "measured_samples_per_s", "gap_pct",
                      "predicted_starvation_pct", "measured_starvation_pct", "bound"]


def prediction_table_rows(diagnosis: Diagnosis) -> List[Dict[str, object]]:
    return [{
        "chain": r.chain, "ranks": r.ranks, "workers": r.workers,
        "predicted_samples_per_s": r.predicted.samples_per_s, "measured_samples_per_s": r.measured_samples_per_s,
        # Percentages to one decimal: the machine's run-to-run noise is several percent.
        "gap_pct": round(100.0 * r.gap, 1),
        "predicted_starvation_pct": round(r.predicted.starvation_pct, 1),
        "measured_starvation_pct": round(r.measured_starvation_pct, 1),
        "bound": r.predicted.bound,
    } for r in diagnosis.rows]


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
        "workers=0; s = consumer ms a step). R ranks multiply the per-rank limits and share the cores.\n",
        markdown_table(cost_rows, list(cost_rows[0])),
        markdown_table(prediction_table_rows(diagnosis), [c for c in PREDICTION_COLUMNS if c != "ranks" or any(
            r.ranks > 1 for r in diagnosis.rows)]),
        "### what to do\n",
        "\n".join(f"{i}. {line}" for i, line in enumerate(diagnosis.advice, 1)) + "\n",
    ]
    return "\n".join(parts)
