"""A job's result, from the measuring that writes it to the readers that load it, and the naming of jobs.

`JobResult` is result.json as one frozen type: the measuring returns one, the task function names it
with a `JobIdentity` and writes `to_json()`, attach and the rank merges build theirs, and the results
loader returns one a file (`from_stored`). Its `key` (a `JobKey` of plain fields, as
torch.utils.benchmark's TaskSpec) is what rounds of one job share. This module alone says how a job is
named: `identity_columns`, `override_pairs`, `ROUND_KEY`, `job_key` and `varying_keys`.
"""

import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.base.typed_json import parse, parse_all
from pipebench.config.specs import JobSpec
from pipebench.record.figures import Summary
from pipebench.record.sections import ConsumerReport, Fingerprint, PassRecord, TransformRow

__all__ = ["HYDRA_PREFIX", "NOT_AXES", "ROUND_COMPONENT", "ROUND_KEY", "SINGLE_PROCESS_FIELDS", "JobIdentity",
           "JobKey", "JobResult", "StoredResult", "canonical", "canonical_text", "identity_columns",
           "edits_chain", "job_key", "override_key", "override_pairs", "varying_keys"]

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


def edits_chain(override: str) -> bool:
    """Whether an override reaches into the chain's config (`transform.per_sample.0.size=...`): it belongs
    to that chain, and composes with no other (`transform=none`, explore's variants)."""
    return override_key(override).startswith("transform.")


def override_pairs(overrides: Sequence[str], ignored: Sequence[str] = NOT_AXES) -> Dict[str, str]:
    """KEY -> VALUE of a job's overrides, without hydra.* and the `ignored` keys."""
    pairs: Dict[str, str] = {}
    for item in overrides:
        _, sep, value = item.partition("=")
        key = override_key(item)
        if sep and not key.startswith(HYDRA_PREFIX) and key not in ignored:
            pairs[key] = canonical_text(value)
    return pairs


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


# The multi-rank columns of a single-process job: one rank, no peer to wait for (the rank merge fills
# them for distributed.nproc > 1).
SINGLE_PROCESS_FIELDS = {"ranks": 1, "straggler_ratio": 1.0, "collective_wait_ms_mean": 0.0}


def identity_columns(spec: JobSpec) -> Dict[str, Any]:
    """The summary row's identity columns of the job `spec` describes, in the row's order: what
    result.json's summary and summary.csv begin with, and what `--baseline` names a job by."""
    return {"dataset": spec.dataset_name, "transform": spec.transform_name, "workers": spec.workers,
            "batch_size": spec.loader.batch_size, "consumer": spec.consumer.kind}


@dataclass(frozen=True)
class JobIdentity:
    """What names a job in its result.json: the label, number, overrides, resolved config and config
    choices Hydra gave it, and its summary row's identity columns (`identity_columns`)."""

    job: str
    job_num: int
    overrides: Tuple[str, ...]
    config: Mapping[str, Any]
    choices: Mapping[str, Any]
    columns: Mapping[str, Any]


@dataclass(frozen=True)
class StoredResult:
    """result.json's mapping read by name once: its identity fields and summary row as stored, and every
    other key (the sections, in written order) in `extra`. Only the summary is required."""

    summary: Mapping[str, Any]
    job: Optional[str] = None
    job_num: int = 0
    overrides: Tuple[str, ...] = ()
    config: Optional[Mapping[str, Any]] = None
    choices: Optional[Mapping[str, Any]] = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Sections:
    """The sections its properties hand out, by name; null or missing ones read as empty."""

    fingerprint: Optional[Mapping[str, Any]] = None
    transforms: Optional[Tuple[Mapping[str, Any], ...]] = None
    passes: Optional[Tuple[Mapping[str, Any], ...]] = None
    rank_passes: Optional[Mapping[str, Any]] = None
    consumer_report: Optional[Mapping[str, Any]] = None


@dataclass(frozen=True, eq=False)
class JobResult:
    """One job's result.json: its typed summary row, its other sections in written order (meters,
    transforms, passes, ..., fingerprint) and, once named, its identity. A summary given as a plain row
    (the measuring's) is read into a `Summary`."""

    summary: Summary
    sections: Mapping[str, Any]
    identity: Optional[JobIdentity] = None

    def __post_init__(self) -> None:
        if not isinstance(self.summary, Summary):
            object.__setattr__(self, "summary", Summary.from_row(self.summary))

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> "JobResult":
        """The result of a result.json mapping. Only the summary's workers and batch size are required: a
        file older than `choices` reads as having none, and an in-memory result that carries only what
        its reader needs (no label, number or config) as having empty ones."""
        stored = parse(StoredResult, data)
        summary = Summary.from_row(stored.summary)
        label = (summary.job or DEFAULT_LABEL) if stored.job is None else stored.job
        identity = JobIdentity(str(label), int(stored.job_num), tuple(str(o) for o in stored.overrides),
                               stored.config or {}, stored.choices or {}, {})
        return cls(summary, stored.extra, identity)

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> "JobResult":
        """`data` as a result: itself when it is one, else `from_stored`'s."""
        return data if isinstance(data, JobResult) else cls.from_stored(data)

    def identified(self, identity: JobIdentity) -> "JobResult":
        """This result, named: its summary row begins with the identity columns and the single-process
        defaults, which the measured row may override (a rank merge's `ranks`)."""
        row = {"job": identity.job, **identity.columns, **SINGLE_PROCESS_FIELDS, **self.summary.row}
        return replace(self, summary=Summary.from_row(row), identity=identity)

    def to_json(self) -> Dict[str, Any]:
        """result.json's content (its schema version aside, which the writer adds): the identity, the
        summary row, then the sections. Without an identity, the summary and the sections alone."""
        named = self.identity
        head = {} if named is None else {"job": named.job, "job_num": named.job_num, "overrides": list(named.overrides),
                                         "config": named.config, "choices": named.choices}
        return {**head, "summary": self.summary.row, **self.sections}

    @property
    def job(self) -> str:
        """Its label; `default` for an unnamed result whose row names none."""
        return self.identity.job if self.identity else self.summary.job or DEFAULT_LABEL

    @property
    def job_num(self) -> int:
        return self.identity.job_num if self.identity else 0

    @property
    def overrides(self) -> Tuple[str, ...]:
        return self.identity.overrides if self.identity else ()

    @property
    def config(self) -> Mapping[str, Any]:
        return self.identity.config if self.identity else {}

    @property
    def choices(self) -> Mapping[str, Any]:
        return self.identity.choices if self.identity else {}

    @property
    def round(self) -> Optional[int]:
        """The round it ran in: its `run.round=K` override, None when it has none (one round)."""
        value = override_pairs(self.overrides, ()).get(ROUND_KEY, "")
        return int(value) if value.isdigit() else None

    @cached_property
    def key(self) -> JobKey:
        """What its rounds share."""
        summary = self.summary
        return JobKey(job_key(self.job), canonical(summary.dataset), canonical(summary.transform), summary.workers,
                      summary.batch_size, canonical(summary.consumer))

    @property
    def pairs(self) -> Dict[str, str]:
        """Its override pairs that can tell jobs apart (override_pairs)."""
        return override_pairs(self.overrides)

    @cached_property
    def _named(self) -> _Sections:
        return parse(_Sections, self.sections)

    @property
    def fingerprint(self) -> Mapping[str, Any]:
        """The host and software it was measured on."""
        return self._named.fingerprint or {}

    @property
    def transforms(self) -> Tuple[Mapping[str, Any], ...]:
        """The per-transform rows."""
        return self._named.transforms or ()

    @property
    def passes(self) -> Tuple[Mapping[str, Any], ...]:
        """Each measured pass's per-step lists."""
        return self._named.passes or ()

    @property
    def rank_passes(self) -> Mapping[str, Any]:
        """A multi-rank job's passes, a list a rank by its number (text); empty for one process."""
        return self._named.rank_passes or {}

    @cached_property
    def transform_rows(self) -> Tuple[TransformRow, ...]:
        """The per-transform rows, typed."""
        return parse_all(TransformRow, self.transforms)

    @cached_property
    def pass_records(self) -> Tuple[PassRecord, ...]:
        """Each measured pass, typed."""
        return parse_all(PassRecord, self.passes)

    @cached_property
    def host(self) -> Fingerprint:
        """The fingerprint, typed."""
        return parse(Fingerprint, self.fingerprint)

    @cached_property
    def consumer_report(self) -> ConsumerReport:
        """The consumer's own record, typed (an empty kind where the file has none)."""
        return parse(ConsumerReport, self._named.consumer_report)
