"""One job's result as the measuring returns it, and its result.json as the job writes it.

`measure_job` and the rank merge (`measure_multirank`) return a frozen `JobResult`: the summary row
and the file's other sections in the order they are written. The task function adds the job's
`JobIdentity` (its label, overrides and config from Hydra; the row's identity columns from its spec,
`identity_columns`, the one place a job's identity is spelled) and writes `to_json()`. The readers'
side of the same file is `pipebench.record.jobs.JobRecord`.
"""

from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from pipebench.config.specs import JobSpec

__all__ = ["SINGLE_PROCESS_FIELDS", "JobIdentity", "JobResult", "identity_columns"]

# The multi-rank columns of a single-process job: one rank, no peer to wait for (multirank.py
# fills them for distributed.nproc > 1).
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


@dataclass(frozen=True, eq=False)
class JobResult(Mapping[str, Any]):
    """What one job measured: its summary row (without identity columns) and result.json's other
    sections in written order (meters, transforms, passes, ..., fingerprint). It also reads as that
    mapping, `summary` first, for the sections no caller needs typed."""

    summary: Mapping[str, Any]
    sections: Mapping[str, Any]
    identity: Optional[JobIdentity] = None

    @property
    def transforms(self) -> List[Mapping[str, Any]]:
        """The per-transform rows."""
        return self.sections["transforms"]

    @property
    def passes(self) -> List[Mapping[str, Any]]:
        """Each measured pass's per-step lists."""
        return self.sections["passes"]

    @property
    def fingerprint(self) -> Mapping[str, Any]:
        """The host and software it was measured on."""
        return self.sections["fingerprint"]

    def identified(self, identity: JobIdentity) -> "JobResult":
        """This result, named: what `to_json` needs to write the whole file."""
        return replace(self, identity=identity)

    def to_json(self) -> Dict[str, Any]:
        """result.json's content (its schema version aside, which the writer adds): the identity, then
        the summary row (identity columns, the single-process defaults, the measured row), then the
        sections. Without an identity, the measured sections alone."""
        if self.identity is None:
            return {"summary": dict(self.summary), **self.sections}
        named = self.identity
        row = {"job": named.job, **named.columns, **SINGLE_PROCESS_FIELDS, **self.summary}
        return {"job": named.job, "job_num": named.job_num, "overrides": list(named.overrides),
                "config": named.config, "choices": named.choices, "summary": row, **self.sections}

    def __getitem__(self, name: str) -> Any:
        return self.summary if name == "summary" else self.sections[name]

    def __iter__(self) -> Iterator[str]:
        yield "summary"
        yield from self.sections

    def __len__(self) -> int:
        return 1 + len(self.sections)
