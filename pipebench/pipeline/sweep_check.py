"""A sweep's jobs built before anything is measured: chains, datasets and loader backends, each
dataset once, and the plan-time lines of what the builds show.

The builds import what the chains and datasets need (torch, torchvision: seconds); the command
runs this in a child of its job process, which has them already (pipebench.sweep.build_check).
"""

import sys
from typing import Any, Dict, List, Sequence, Tuple

from pipebench.config.specs import JobSpec
from pipebench.pipeline.build import build_dataset, build_transforms
from pipebench.pipeline.loader_backends import check_backends
from pipebench.storage.dataset_contract import told

__all__ = ["check_sweep_builds", "plan_lines"]


def check_sweep_builds(specs: Sequence[JobSpec]) -> None:
    """Build every job's chains and each distinct dataset once, check every backend can read its
    dataset (ConfigError), and print the plan-time warnings to stderr."""
    datasets_built: Dict[str, Any] = {}
    backends = []
    for spec in specs:
        build_transforms(spec.per_sample, "transform.per_sample")
        build_transforms(spec.per_batch, "transform.per_batch")
        key = repr(sorted(spec.dataset.items())) + f"|{spec.loader.batch_size}|{spec.loader.drop_last}"
        if key not in datasets_built:
            datasets_built[key] = build_dataset(spec)
        backends.append((spec.loader.backend, datasets_built[key]))
    # Every backend's library is installed (all the missing ones named in one line) and can read its
    # dataset, before any job runs.
    check_backends(backends)
    warnings, notes = plan_lines(specs, [dataset for _, dataset in backends])
    for kind, lines in (("warning", warnings), ("note", notes)):
        for line in lines:
            print(f"{kind}: {line}", file=sys.stderr, flush=True)


def plan_lines(specs: Sequence[JobSpec], datasets: Sequence[Any]) -> Tuple[List[str], List[str]]:
    """The sweep's plan-time warnings (each job's, as its dataset reads it) and notes (each dataset's
    build), each line once (pipebench.storage.dataset_contract)."""
    contracts = [told(dataset) for dataset in datasets]
    warnings = (line for spec, contract in zip(specs, contracts) for line in contract.plan_warnings(spec))
    notes = (line for contract in contracts for line in contract.plan_notes())
    return list(dict.fromkeys(warnings)), list(dict.fromkeys(notes))
