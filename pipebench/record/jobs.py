"""A stored job as the readers see it: a frozen record, its hashable key, and its labels.

The results loader (`pipebench.record.results.load_job_results`) returns a `JobRecord` per
result.json. Its `key` (a `JobKey` of plain fields, as torch.utils.benchmark's TaskSpec) is
what rounds of one job share. This module alone says how a job is named: its override pairs
(`override_pairs`), the round it ran in (`ROUND_KEY`), its label less the round (`job_key`),
and which keys tell jobs apart (`varying_keys`). Report, compare, explore and history use it.
"""

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.base.mapping_view import MappingView
from pipebench.record.figures import Summary

__all__ = ["HYDRA_PREFIX", "JobKey", "JobRecord", "NOT_AXES", "ROUND_COMPONENT", "ROUND_KEY", "canonical",
           "canonical_text", "job_key", "override_key", "override_pairs", "round_of", "varying_keys"]

# The override of a job's round (`rounds=N` sweeps it): rounds of one job share everything else.
ROUND_KEY = "run.round"
# A job label's `run.round=K` component.
ROUND_COMPONENT = re.compile(r"(?:^|,)run\.round=\d+(?=,|$)")
# Override keys that never tell jobs apart: which round a job was, where it wrote, progress bars.
NOT_AXES = (ROUND_KEY, "results_dir", "run.progress")
HYDRA_PREFIX = "hydra."
# The label of a job run with no override at all (Hydra's override_dirname is then empty).
DEFAULT_LABEL = "default"


def job_key(label: str) -> str:
    """The job label with any `run.round=K` component removed, so rounds group together."""
    return ROUND_COMPONENT.sub("", label).lstrip(",") or DEFAULT_LABEL


def canonical(value: object) -> str:
    """A config value as an override would spell it (true, null, 8)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    return str(value)


def canonical_text(text: str) -> str:
    """Hydra's sweeper writes parsed booleans back as True/False; spell them as configs do."""
    return {"true": "true", "false": "false", "none": "null", "null": "null"}.get(text.lower(), text)


def override_key(override: str) -> str:
    """`KEY` of a `KEY=VALUE` override, without Hydra's `+` / `~` prefixes."""
    return override.partition("=")[0].lstrip("+~")


def override_pairs(overrides: Sequence[str], ignored: Sequence[str] = NOT_AXES) -> Dict[str, str]:
    """KEY -> VALUE of a job's overrides, without hydra.* and the `ignored` keys."""
    pairs: Dict[str, str] = {}
    for item in overrides:
        _, sep, value = item.partition("=")
        key = override_key(item)
        if sep and not key.startswith(HYDRA_PREFIX) and key not in ignored:
            pairs[key] = canonical_text(value)
    return pairs


def round_of(overrides: Sequence[str]) -> Optional[int]:
    """The round a job ran in (its `run.round=K` override); None when it has none."""
    for item in overrides:
        value = item.partition("=")[2]
        if override_key(item) == ROUND_KEY and value.isdigit():
            return int(value)
    return None


def varying_keys(named: Sequence[Mapping[str, str]]) -> List[str]:
    """The keys whose values differ between jobs (a job without the key differs from one with
    it), in the order they are first named."""
    keys = dict.fromkeys(k for names in named for k in names)
    return [k for k in keys if len({names.get(k) for names in named}) > 1]


@dataclass(frozen=True)
class JobKey:
    """What the rounds of one job share: plain, hashable fields (as torch.utils.benchmark's TaskSpec)."""

    label: str  # the job's label less `run.round=K` (job_key)
    dataset: str
    transform: str
    workers: int
    batch_size: int
    consumer: str


@dataclass(frozen=True, eq=False)
class JobRecord(MappingView):
    """One stored job (result.json, checked by the loader), with its identity and its summary's figures
    typed. It also reads as the stored mapping, for the sections no reader needs typed (gpu, memory,
    ranks...)."""

    key: JobKey
    job: str
    job_num: int
    # The round it ran in: its `run.round=K` override, None when it has none (one round).
    round: Optional[int]
    overrides: Tuple[str, ...]
    summary: Summary
    config: Mapping[str, Any]
    choices: Mapping[str, Any]
    fingerprint: Mapping[str, Any]
    # The per-transform rows and each measured pass's per-step lists.
    transforms: Tuple[Mapping[str, Any], ...]
    passes: Tuple[Mapping[str, Any], ...]
    stored: Mapping[str, Any]

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> "JobRecord":
        """The record of a result.json mapping. Only the summary's workers and batch size are required: a
        file older than `choices` reads as having none, and an in-memory result that carries only what
        its reader needs (no label, number or config) as having empty ones."""
        summary = Summary.from_row(data["summary"])
        job = str(data.get("job", summary.job or DEFAULT_LABEL))
        key = JobKey(job_key(job), canonical(summary.dataset), canonical(summary.transform), summary.workers,
                     summary.batch_size, canonical(summary.consumer))
        overrides = tuple(str(o) for o in data.get("overrides", ()))
        return cls(key, job, int(data.get("job_num", 0)), round_of(overrides), overrides, summary,
                   data.get("config") or {}, data.get("choices") or {}, data.get("fingerprint") or {},
                   tuple(data.get("transforms") or ()), tuple(data.get("passes") or ()), data)

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> "JobRecord":
        """`data` as a record: itself when it is one, else `from_stored`'s."""
        return data if isinstance(data, JobRecord) else cls.from_stored(data)

    @property
    def pairs(self) -> Dict[str, str]:
        """Its override pairs that can tell jobs apart (override_pairs)."""
        return override_pairs(self.overrides)

    def _view(self) -> Mapping[str, Any]:
        return self.stored
