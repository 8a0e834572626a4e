"""What every measuring process does the same way: seed the generators, and fingerprint the job.

The job process and each torchrun rank both import this, so neither imports the other.
"""

import random
from typing import Any, Dict

import numpy as np
import torch

from pipebench.config.specs import JobSpec
from pipebench.measure.fingerprint import fingerprint

__all__ = ["job_fingerprint", "seed_everything", "start_method"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def start_method(spec: JobSpec) -> str:
    """How the job's DataLoader workers start ("none" without workers)."""
    if spec.workers == 0:
        return "none"
    return spec.loader.multiprocessing_context or torch.multiprocessing.get_start_method()


def job_fingerprint(spec: JobSpec, dataset: Any) -> Dict[str, Any]:
    """The fingerprint of a job on this host; call once the loader's workers are gone."""
    identity = getattr(dataset, "identity", None)
    return fingerprint(identity() if identity else {"class": type(dataset).__name__}, start_method(spec))
