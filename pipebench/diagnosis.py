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

What the model leaves out (collate and IPC delivery, pin-memory, the main loop's own
bookkeeping, page cache) is what the gap between prediction and measurement is made of, so
the report prints both side by side and names the candidates.
"""

import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from pipebench.tables import format_value, markdown_table

# Overrides that never define a chain: the axis the model predicts along, and repetition.
NON_CHAIN_KEYS = ("workers", "run.round", "results_dir")
# A measurement within this of the prediction is explained by the model; shared 2-core machines
# wobble by up to ~15% between back-to-back runs (benchmarks/overhead.py's A/A spread).
EXPLAINED_WITHIN = 0.15
# A variant must beat the base chain's per-sample cost by this much to be worth recommending;
# below it the difference is within the per-transform timings' own run-to-run noise.
WORTHWHILE_SPEEDUP = 1.05
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
    workers: int
    predicted: Prediction
    measured_samples_per_s: float
    measured_starvation_pct: float
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


def predict(costs: ChainCosts, workers: int) -> Prediction:
    """Samples/s and starvation % of `costs` with `workers` DataLoader workers (see the module doc)."""
    batch, c, s = costs.batch_size, costs.ms_per_sample, costs.consumer_ms
    if workers == 0:
        step_ms = batch * c + s
        return Prediction(1000.0 * batch / step_ms, 100.0 * batch * c / step_ms, "serial")
    limits = {
        "consumer": batch / s if s > 0 else math.inf,
        "workers": workers / c,
        "cores": costs.usable_cores / (costs.cpu_ms_per_sample + costs.consumer_cpu_ms / batch),
    }
    bound = min(limits, key=limits.get)
    rate = limits[bound]  # samples a ms
    starvation = 100.0 * (1.0 - rate * s / batch) if s > 0 else 100.0
    return Prediction(1000.0 * rate, max(starvation, 0.0), bound)


def workers_to_feed(costs: ChainCosts) -> Optional[int]:
    """The fewest workers whose output matches the consumer's appetite, or None if the cores can't."""
    if costs.consumer_ms <= 0:
        return None
    needed = math.ceil(costs.ms_per_sample * costs.batch_size / costs.consumer_ms)
    feeds = predict(costs, needed).bound == "consumer"
    return needed if feeds else None


def chain_label(result: Mapping) -> str:
    """A job's chain: its overrides less the worker count and the round; the transform name if none."""
    overrides = [o for o in result.get("overrides", []) if o.split("=", 1)[0].lstrip("+~") not in NON_CHAIN_KEYS]
    return ",".join(overrides) or str(result["summary"]["transform"])


def _consumer_ms(result: Mapping) -> float:
    steps = [c + h for p in result["passes"] for c, h in zip(p["compute_ms"], p["h2d_ms"])]
    return float(np.median(steps)) if steps else float("nan")


def chain_costs(results: Sequence[Mapping]) -> ChainCosts:
    """One chain's costs, from its workers=0 jobs (median over rounds), else its CPU time in workers."""
    serial = [r for r in results if r["summary"]["workers"] == 0]
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


def _group(results: Sequence[Mapping]) -> Dict[str, List[Mapping]]:
    groups: Dict[str, List[Mapping]] = {}
    for result in results:
        groups.setdefault(chain_label(result), []).append(result)
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
    base_costs = costs[base]
    lines = []
    for chain, other in costs.items():
        if chain == base:
            continue
        speedup = base_costs.ms_per_sample / other.ms_per_sample
        verdict = "pays" if speedup >= WORTHWHILE_SPEEDUP else "does not pay"
        best = max(predict(other, w).samples_per_s for w in range(0, 2 * other.usable_cores + 1))
        lines.append(f"{chain} {verdict}: {format_value(other.ms_per_sample)} ms a sample against "
                     f"{format_value(base_costs.ms_per_sample)} ({format_value(speedup)}x); "
                     f"predicted best {format_value(best)} samples/s on this machine.")
    if not lines:
        return ["Reordering and batching: only one chain was measured; `pipebench explore` measures the variants."]
    return lines


def _advice_unexplained(rows: Sequence[PredictedRow], results: Sequence[Mapping]) -> List[str]:
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
    named = ", ".join(f"{r.chain} at workers={r.workers} ({format_value(100 * r.gap)}%)" for r in off)
    return [f"Unexplained: {named} differ from the model by more than {format_value(100 * EXPLAINED_WITHIN)}%. "
            f"The model leaves out {'; '.join(candidates)}."]


def diagnose(results: Sequence[Mapping]) -> Diagnosis:
    """Predict every measured (chain, workers) and write the advice; `results` are result.json dicts."""
    groups = _group(results)
    costs = {chain: chain_costs(jobs) for chain, jobs in groups.items()}
    rows = []
    for chain, jobs in groups.items():
        for workers in sorted({j["summary"]["workers"] for j in jobs}):
            same = [j["summary"] for j in jobs if j["summary"]["workers"] == workers]
            rows.append(PredictedRow(
                chain=chain, workers=workers, predicted=predict(costs[chain], workers),
                measured_samples_per_s=float(np.median([s["samples_per_s"] for s in same])),
                measured_starvation_pct=float(np.median([s["starvation_pct"] for s in same])),
                jobs=len(same),
            ))
    base = next(iter(groups))
    advice = [*_advice_dominant(base, groups[base]), *_advice_workers(base, costs[base]),
              *_advice_variants(base, costs), *_advice_unexplained(rows, results)]
    return Diagnosis(rows=tuple(rows), costs=tuple(costs.items()), advice=tuple(advice))


PREDICTION_COLUMNS = ["chain", "workers", "predicted_samples_per_s", "measured_samples_per_s", "gap_pct",
                      "predicted_starvation_pct", "measured_starvation_pct", "bound"]


def prediction_table_rows(diagnosis: Diagnosis) -> List[Dict[str, object]]:
    return [{
        "chain": r.chain, "workers": r.workers,
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
        "workers=0; s = consumer ms a step).\n",
        markdown_table(cost_rows, list(cost_rows[0])),
        markdown_table(prediction_table_rows(diagnosis), PREDICTION_COLUMNS),
        "### what to do\n",
        "\n".join(f"{i}. {line}" for i, line in enumerate(diagnosis.advice, 1)) + "\n",
    ]
    return "\n".join(parts)
