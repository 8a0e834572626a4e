"""GPU utilisation as the driver reports it (NVML), sampled on a thread over the measured steps.

NVML's "GPU utilisation" is the share of the last sample period (1/6 s to 1 s by GPU) in
which at least one kernel ran: the number nvidia-smi prints, and an independent check on
pipebench's own `accel_util_pct` (consumer time / step time, measured on the host).

It reads NVML through `pynvml` (the `nvidia-ml-py` package: `pip install "pipebench[gpu]"`)
directly. torch.cuda.utilization() reads the same counter but first resolves the current CUDA
device, which creates a CUDA context, and DataLoader workers may still fork after the sampler
starts. Without CUDA, or without NVML, it records nothing and the report says why.
"""

import os
import threading
from dataclasses import dataclass
from typing import List, Optional

import torch

# 0.1 s: shorter than NVML's own sample period on every GPU, so no period is missed, and
# ~10 NVML calls a second cost nothing next to a training step.
DEFAULT_INTERVAL_S = 0.1
JOIN_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class GpuUtilReport:
    """NVML utilisation samples (%) between start and stop. Empty with a `note` when not measured."""

    samples: List[int]
    interval_s: float
    note: Optional[str]

    @property
    def mean_pct(self) -> Optional[float]:
        return sum(self.samples) / len(self.samples) if self.samples else None


def _nvml_index() -> int:
    """NVML index of CUDA device 0: the first entry of CUDA_VISIBLE_DEVICES when it is a number."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def _open_nvml():
    """(pynvml module, device handle), or (None, reason) when NVML cannot be read here."""
    if not torch.cuda.is_available():
        return None, "not measured: no CUDA"
    try:
        import pynvml
    except ImportError:
        return None, "not measured: NVML bindings missing (pip install 'pipebench[gpu]')"
    try:
        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(_nvml_index())
    except pynvml.NVMLError as exc:
        return None, f"not measured: NVML unavailable ({exc})"


class GpuUtilSampler:
    """start() ... stop() -> GpuUtilReport. Samples NVML utilisation every `interval_s` in between.

    `enabled=False` (the consumer is not on CUDA) records nothing.
    """

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, enabled: bool = True):
        self.interval_s = interval_s
        self._enabled = enabled
        self._samples: List[int] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._note: Optional[str] = None if enabled else "not measured: no CUDA consumer"

    def start(self) -> None:
        if not self._enabled:
            return
        nvml, handle = _open_nvml()
        if nvml is None:
            self._note = handle
            return
        self._thread = threading.Thread(target=self._run, args=(nvml, handle), name="pipebench-gpu-util",
                                        daemon=True)
        self._thread.start()

    def _run(self, nvml, handle) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._samples.append(int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            except nvml.NVMLError as exc:
                self._note = f"NVML stopped answering ({exc})"
                return

    def stop(self) -> GpuUtilReport:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(JOIN_TIMEOUT_S)
            self._thread = None
            if not self._samples and self._note is None:
                self._note = "not measured: the steps ended before the first NVML sample"
        return GpuUtilReport(list(self._samples), self.interval_s, self._note)
