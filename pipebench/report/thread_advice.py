"""Where threads lose, in words: a what-to-do line for each step whose thread profile says it holds the GIL.

Reads the transforms.csv cells a thread profile fills (`pipebench.measure.thread_profile`) and the
job's `thread_profile` record; the verdict itself is `pipebench.measure.thread_verdict`'s.
"""

from typing import Dict, List, Sequence, Tuple

from pipebench.measure.thread_verdict import HOLDS_GIL
from pipebench.record.jobs import JobResult
from pipebench.record.sections import StoredThreadProfile, TransformRow
from pipebench.report.job_sections import sections_of

__all__ = ["GIL_LINE_MIN_SHARE_PCT", "gil_bound_steps", "gil_lines"]

# A step under this share of the chain's time is not named even when it holds the GIL: queueing
# for it costs the chain at most that share, within a run's noise (a load step of a few
# microseconds often reads as GIL-bound and matters to no one).
GIL_LINE_MIN_SHARE_PCT = 5.0
# A top speed-up at least this much above the one at the count before (itself 2 threads or more):
# the step was still gaining when the profile stopped, so "it stops scaling at" would misread it (the
# PIL decode read 2.70x at 4 and 4.57x at 8 threads, held back by the Python around the decoder).
STILL_RISING = 1.1


def _what_to_do(profile: StoredThreadProfile) -> str:
    if profile.on_threads:
        return (f"Under loader.backend={profile.backend} its worker threads queue for it: run it in worker "
                "processes (loader.backend=dataloader), or make it release the GIL (whole-array torch or NumPy ops, "
                "a C extension).")
    return "A thread backend would not help this step: keep worker processes (loader.backend=dataloader)."


def _capped(profile: StoredThreadProfile) -> str:
    if not profile.capped_by_cores:
        return ""
    return (f"; profiled up to {profile.usable_cores} threads, the host's usable cores, not the job's "
            f"{profile.workers} workers")


def _how_far(speedups: Sequence[Tuple[int, float]]) -> str:
    """Where the step's speed-up ended: stopped (its best), or still rising at the top count."""
    best = max(s for _, s in speedups)
    (before_k, before), (top_k, top) = speedups[-2], speedups[-1]
    if before_k >= 2 and top == best and top >= STILL_RISING * before:
        return (f"it reaches only {top:.1f}x at {top_k} threads ({100 * top / top_k:.0f}% of the ideal "
                f"{top_k}x), still rising")
    return f"it stops scaling at {best:.1f} threads"


def _line(result: JobResult, profile: StoredThreadProfile, row: TransformRow) -> str:
    speedups = profile.step(row.stage, row.transform).speedups()
    threads = speedups[-1][0]
    curve = ", ".join(f"{s:.2f}x at {k}" for k, s in speedups[1:])
    return (f"{row.transform} holds the GIL: {_how_far(speedups)} "
            f"(transform={result.summary.transform}, called alone: {curve} threads; off the CPU "
            f"{row.off_cpu_pct_1t:.0f}% of its time alone, {row.off_cpu_pct_nt:.0f}% at "
            f"{threads} threads{_capped(profile)}). {_what_to_do(profile)}")


def _names_gil(row: TransformRow) -> bool:
    """A profiled step that holds the GIL and weighs enough of the chain to be named."""
    return row.thread_verdict == HOLDS_GIL and row.share_pct >= GIL_LINE_MIN_SHARE_PCT


def gil_bound_steps(results: Sequence[JobResult]) -> List[str]:
    """The steps `gil_lines` would name for these jobs, each once, in chain order."""
    return list(dict.fromkeys(row.transform for result in results if sections_of(result).thread_profile
                              for row in result.transform_rows if _names_gil(row)))


def gil_lines(results: Sequence[JobResult]) -> List[str]:
    """One line per GIL-bound step worth naming, once per chain and step: from the profile with the
    most threads, a thread backend's on a tie (its advice is the one to act on)."""
    picked: Dict[Tuple[str, str, str], Tuple[Tuple[int, bool], JobResult, StoredThreadProfile, TransformRow]] = {}
    for result in results:
        profile = sections_of(result).profile
        if profile is None:
            continue
        for row in result.transform_rows:
            if not _names_gil(row):
                continue
            key = (str(result.summary.transform), row.stage, row.transform)
            rank = (row.profile_threads, bool(profile.on_threads))
            if key not in picked or rank > picked[key][0]:
                picked[key] = (rank, result, profile, row)
    return [_line(result, profile, row) for _, result, profile, row in picked.values()]
