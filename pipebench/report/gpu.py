"""The GPU tables under the summary: the masked-loss pair (syncs and step-time ratio) and GPU time use.

The pair table matches each `consumer=masked_loss_sync` row with the `masked_loss_fixed` row of
the same dataset, transform, workers, batch size and pinning (round by round when rounds > 1),
and divides their step times: consumer time (the training step alone) and the whole step.
"""

from collections import defaultdict
from typing import Dict, List, Mapping, Optional, Sequence

from pipebench.base.tables import markdown_table
from pipebench.config.specs import MASKED_LOSS_KINDS
from pipebench.record.figures import Summary

SYNC_KIND, FIXED_KIND = MASKED_LOSS_KINDS
PAIR_COLUMNS = [
    "sync_job", "fixed_job", "syncs_per_step_sync", "syncs_per_step_fixed", "consumer_ms_sync", "consumer_ms_fixed",
    "consumer_ms_ratio", "step_ms_ratio", "gpu_notes",
]
# Rows that show what the GPU did; printed only when some job ran on CUDA.
GPU_COLUMNS = [
    "job", "pin_memory", "h2d_ms_median", "h2d_gpu_ms_median", "accel_util_pct", "gpu_util_pct", "gpu_busy_pct",
    "trace_accel_util_pct", "idle_host_wait_pct", "idle_kernel_wait_pct", "idle_other_pct", "syncs_per_step", "reserved_mb_peak",
    "alloc_retries", "reserved_oscillating",
]


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def _pair_key(row: Summary) -> tuple:
    """What a sync job and its fixed job share: dataset, transform, workers, batch size and pinning."""
    return row.dataset, row.transform, row.workers, row.batch_size, row.pin_memory


def masked_loss_pairs(rows: Sequence[Summary]) -> List[Dict[str, object]]:
    """One row per (sync, fixed) pair of jobs that differ only in the masked-loss variant."""
    by_kind: Dict[str, Dict[tuple, List[Summary]]] = {SYNC_KIND: defaultdict(list), FIXED_KIND: defaultdict(list)}
    for row in rows:
        if row.consumer in by_kind:
            by_kind[row.consumer][_pair_key(row)].append(row)
    pairs = []
    for key, syncs in by_kind[SYNC_KIND].items():
        for s, f in zip(syncs, by_kind[FIXED_KIND].get(key, [])):
            pairs.append({
                "sync_job": s.job,
                "fixed_job": f.job,
                "syncs_per_step_sync": s.syncs_per_step,
                "syncs_per_step_fixed": f.syncs_per_step,
                "consumer_ms_sync": s.consumer_ms_median,
                "consumer_ms_fixed": f.consumer_ms_median,
                "consumer_ms_ratio": _ratio(s.consumer_ms_median, f.consumer_ms_median),
                "step_ms_ratio": _ratio(s.step_ms_median, f.step_ms_median),
                "gpu_notes": s.gpu_notes,
            })
    return pairs


def gpu_markdown(rows: Sequence[Mapping[str, object]]) -> str:
    """The GPU sections for summary.md: empty when there is nothing GPU-related to show."""
    parts = []
    summaries = [Summary.from_row(row) for row in rows]
    pairs = masked_loss_pairs(summaries)
    if pairs:
        parts.append("## masked loss: syncs per step and step-time ratio (sync / fixed)\n\n"
                     + markdown_table(pairs, PAIR_COLUMNS))
    on_gpu = [s.row for s in summaries if s.h2d_gpu_ms_median is not None or s.gpu_busy_pct is not None]
    if on_gpu:
        parts.append("## GPU\n\n" + markdown_table(on_gpu, GPU_COLUMNS))
    return "\n".join(parts)
