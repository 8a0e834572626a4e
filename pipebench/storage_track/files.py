"""The storage check's files: verdict.json (shaped like mlpstorage's) and report.md, its table."""

import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.base.io import write_json_atomic, write_text_atomic
from pipebench.base.tables import markdown_table
from pipebench.config.specs import EMULATED
from pipebench.storage_track.held_back import HeldBack
from pipebench.storage_track.presets import Preset
from pipebench.storage_track.rules import REPLICATION, Procedure, Verdict
from pipebench.storage_track.search import SearchOutcome

__all__ = ["NOT_MLPERF", "CheckResult", "Run", "report_text", "verdict_payload", "write_check"]

VERDICT_FILE, REPORT_FILE = "verdict.json", "report.md"
VERDICT_VERSION = 1
# Said wherever a result is shown: MLPerf is a trademark of MLCommons.
NOT_MLPERF = ("MLPerf Storage-style check by pipebench: these are not MLPerf results, and are not endorsed by "
              "MLCommons (MLPerf is its trademark)")


@dataclass(frozen=True)
class Run:
    """One finished run's figures: its seed, AU (the least rank's), samples/s (the steady rate with the
    first batch's wait kept in its time, as the rules keep it) and MiB/s from storage."""

    seed: int
    au_pct: float
    samples_per_s: float
    mb_per_s: float
    first_batch_s: float


@dataclass(frozen=True)
class CheckResult:
    preset: Preset
    chain: str
    procedure: Procedure
    verdict: Verdict
    search: SearchOutcome
    runs: Tuple[Run, ...]
    # The same N with no chain (None when the chain is none already or it did not run), and the
    # chain's costliest step (name, ms a sample) where it was measured.
    without_chain: Optional[Run]
    costliest_step: Optional[Tuple[str, float]]
    shared_mb_per_s: Optional[float]
    predicted: Optional[int]
    overrides: Tuple[str, ...]
    # What held the least N that missed back (None where the search missed none above its N).
    held_back: Optional[HeldBack] = None
    # What stood for the accelerator: the preset's emulated step, or a real consumer's own (the toy CNN).
    consumer: str = EMULATED


def _mean(values: Sequence[float]) -> Optional[float]:
    return statistics.fmean(values) if values else None


def verdict_payload(result: CheckResult) -> Dict[str, object]:
    """verdict.json's mapping."""
    runs, done = result.runs, result.procedure
    return {
        "schema_version": VERDICT_VERSION,
        "note": NOT_MLPERF,
        "verdict": result.verdict.verdict,
        "reasons": list(result.verdict.reasons),
        "accelerators": done.accelerators,
        "au_pct": [r.au_pct for r in runs],
        "min_au_pct": done.min_au_pct,
        "samples_per_s": _mean([r.samples_per_s for r in runs]),
        "samples_per_s_runs": [r.samples_per_s for r in runs],
        "mb_per_s": _mean([r.mb_per_s for r in runs]),
        "spread": None if math.isnan(result.verdict.spread) else result.verdict.spread,
        "replicated_within_5pct": result.verdict.replicated,
        "seeds": [r.seed for r in runs],
        "workload": result.preset.workload,
        "accelerator": result.preset.accelerator,
        "step_ms": result.preset.step_ms,
        "consumer": result.consumer,
        "batch_size": result.preset.batch_size,
        "chain": result.chain,
        "shared_mb_per_s": result.shared_mb_per_s,
        "predicted_accelerators": result.predicted,
        "search": [asdict(p) for p in result.search.probes],
        "search_capped": result.search.capped,
        "without_chain": None if result.without_chain is None else {
            "samples_per_s": result.without_chain.samples_per_s, "au_pct": result.without_chain.au_pct,
            "mb_per_s": result.without_chain.mb_per_s},
        "costliest_step": None if result.costliest_step is None else {
            "step": result.costliest_step[0], "ms_per_sample": result.costliest_step[1]},
        "held_back": None if result.held_back is None else {**asdict(result.held_back),
                                                             "line": result.held_back.line()},
        "overrides": list(result.overrides),
    }


def _row(label: str, run: Run, min_au: float) -> Mapping[str, object]:
    return {"run": label, "seed": run.seed, "au_pct": round(run.au_pct, 1), "meets": run.au_pct >= min_au,
            "samples_per_s": round(run.samples_per_s, 1), "mb_per_s": round(run.mb_per_s, 1),
            "first_batch_s": round(run.first_batch_s, 2)}


def report_text(result: CheckResult) -> str:
    """report.md: the verdict and its reasons, the runs, the search and the chain's cost."""
    done, found = result.procedure, result.verdict
    lines: List[str] = [f"# storage check: {result.preset.workload} on {done.accelerators} emulated "
                        f"{result.preset.accelerator} accelerator(s): {found.verdict}", "", f"_{NOT_MLPERF}._", ""]
    lines += [f"- {reason}" for reason in found.reasons] or ["- every rule met"]
    spread = "n/a" if math.isnan(found.spread) else f"{found.spread:.1%}"
    step = f"Step {result.preset.step_ms:g} ms" if result.consumer == EMULATED else f"consumer={result.consumer}'s own step"
    lines += ["", f"{step} a batch of {result.preset.batch_size}, minimum AU "
              f"{done.min_au_pct:g}%, chain `{result.chain}`; runs replicate within {REPLICATION:.0%}: "
              f"{'yes' if found.replicated else 'no'} (largest departure from the mean {spread}).", ""]
    rows = [_row(str(i + 1), run, done.min_au_pct) for i, run in enumerate(result.runs)]
    if result.without_chain is not None:
        rows.append(_row("no chain", result.without_chain, done.min_au_pct))
    columns = ["run", "seed", "au_pct", "meets", "samples_per_s", "mb_per_s", "first_batch_s"]
    lines += [markdown_table(rows, columns, right=columns[1:]), ""]
    if result.without_chain is not None and result.runs:
        with_chain = statistics.fmean(r.samples_per_s for r in result.runs)
        cost = (f"; its costliest step is `{result.costliest_step[0]}` ({result.costliest_step[1]:.3g} ms a "
                "sample)") if result.costliest_step else ""
        lines += [f"Preprocessing against storage: at {done.accelerators} accelerator(s), {with_chain:.1f} "
                  f"samples/s with `{result.chain}` against {result.without_chain.samples_per_s:.1f} without it, "
                  f"AU {statistics.fmean(r.au_pct for r in result.runs):.1f}% against "
                  f"{result.without_chain.au_pct:.1f}%{cost}.", ""]
    if result.predicted is not None:
        lines += [f"The arithmetic (floor(M x S / (AU x B x size)), {result.shared_mb_per_s:g} MiB/s shared, no "
                  f"chain) predicts {result.predicted} accelerator(s).", ""]
    if result.held_back is not None:
        lines += [f"What held one more back: {result.held_back.line()}.", ""]
    search = [{"accelerators": p.accelerators, "au_pct": ", ".join(f"{a:.1f}" for a in p.au_pct),
               "meets": p.meets, "failed_rounds": p.failed} for p in result.search.probes]
    lines += ["## the search", "", markdown_table(search, ["accelerators", "au_pct", "meets", "failed_rounds"]), ""]
    if result.search.capped:
        lines += [f"The search stopped at storage_check.max_accelerators={done.accelerators}, which met the "
                  "minimum: more may.", ""]
    return "\n".join(lines)


def write_check(folder: Path, result: CheckResult) -> str:
    """verdict.json and report.md in `folder`; report.md's text."""
    text = report_text(result)
    write_json_atomic(folder / VERDICT_FILE, verdict_payload(result))
    write_text_atomic(folder / REPORT_FILE, text)
    return text
