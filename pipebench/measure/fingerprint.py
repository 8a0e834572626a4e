"""The machine and software a result was measured on (docs/results-schema.md, "fingerprint").

Never environment variables: results get committed and shared, and tokens live in the environment.
"""

import importlib.metadata
import importlib.util
import os
import platform
import re
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import numpy
import PIL
import torch
from PIL import features

import pipebench
from pipebench.base.cores import cgroup_cpu_quota, usable_cores
from pipebench.base.io import folder_safe
from pipebench.base.typed_json import parse
from pipebench.config.specs import JobSpec
from pipebench.record.sections import Fingerprint
from pipebench.storage.dataset_contract import told

# The line of torchvision's version.py that holds `torchvision.__version__` (local build tag included).
TORCHVISION_VERSION_LINE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)
# git must answer quickly or not at all: a fingerprint is never worth a hang.
GIT_TIMEOUT_S = 5


def cpu_model() -> str:
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _git(*args: str) -> Optional[subprocess.CompletedProcess]:
    """`git ARGS` in the working directory; None when git is missing or does not answer in time."""
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_commit() -> Optional[str]:
    out = _git("rev-parse", "HEAD")
    return (out.stdout.strip() or None) if out else None


def git_dirty() -> Optional[bool]:
    """Whether the code under test (the working directory's repository) has uncommitted changes
    to tracked files; None outside a repository."""
    out = _git("status", "--porcelain", "--untracked-files=no")
    return bool(out.stdout.strip()) if out and out.returncode == 0 else None


def libjpeg_turbo_version() -> Optional[str]:
    """The libjpeg-turbo Pillow decodes with (decode is most of the seed chain), or None."""
    try:
        return features.version_feature("libjpeg_turbo") if features.check_feature("libjpeg_turbo") else None
    except ValueError:  # a Pillow that does not know the feature
        return None


def torchvision_version() -> Optional[str]:
    """`torchvision.__version__` without importing torchvision (seconds, torch._dynamo included),
    which a job whose chain uses none of it need not pay: read from the installed package."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():
        try:
            match = TORCHVISION_VERSION_LINE.search((Path(folder) / "version.py").read_text())
        except OSError:
            continue
        if match:
            return match.group(1)
    return importlib.metadata.version("torchvision")


def _machine_name(model: str, cores: int) -> str:
    """CPU model and usable cores, the fields compare refuses to mix, as a folder name (e.g. `AMD_EPYC-2c`)."""
    return folder_safe("_".join(f"{model}-{cores}c".split()))


def machine_folder(fingerprint: Mapping[str, Any]) -> str:
    """A folder name for a machine's stored baselines and history, from a result's fingerprint."""
    host = parse(Fingerprint, fingerprint)
    return _machine_name(host.cpu_model, host.usable_cores)


def machine_key() -> str:
    """This machine's `machine_folder`."""
    return _machine_name(cpu_model(), usable_cores())


def gpu_name() -> Optional[str]:
    """Call only after DataLoader workers are gone: querying the device initialises CUDA, and a worker forked after that cannot use it."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def fingerprint(dataset_identity: Dict[str, Any], worker_start: str) -> Dict[str, Any]:
    return {
        "pipebench": pipebench.__version__,
        "torch": torch.__version__,
        "torchvision": torchvision_version(),
        "pillow": PIL.__version__,
        "libjpeg_turbo": libjpeg_turbo_version(),
        "numpy": numpy.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "cgroup_cpu_quota": cgroup_cpu_quota(),
        "gpu": gpu_name(),
        "start_method": worker_start,
        "dataset": dataset_identity,
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
    }


def start_method(spec: JobSpec) -> str:
    """How the job's DataLoader workers start ("none" without workers)."""
    if spec.workers == 0:
        return "none"
    return spec.loader.multiprocessing_context or torch.multiprocessing.get_start_method()


def job_fingerprint(spec: JobSpec, dataset: Any) -> Dict[str, Any]:
    """The fingerprint of a job on this host; call once the loader's workers are gone."""
    return fingerprint(told(dataset).identity(), start_method(spec))
