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
from typing import Any, Dict, List, Optional

import torch

from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED

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
    """A Meter: samples NVML utilisation every `interval_s` from the FIRST_MEASURED mark to the
    LAST_MEASURED mark (or stop()), so warm-up never dilutes it. stop() returns the GpuUtilReport.

    `enabled=False` (the consumer is not on CUDA) records nothing.
    """

    key = "gpu_util"

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, enabled: bool = True):
        self.interval_s = interval_s
        self._enabled = enabled
        self._samples: List[int] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._note: Optional[str] = None if enabled else "not measured: no CUDA consumer"
        self._report: Optional[GpuUtilReport] = None

    def start(self) -> None:
        """Nothing: sampling spans the measured steps only, from the FIRST_MEASURED mark."""

    def mark(self, name: str) -> None:
        if name == FIRST_MEASURED:
            self._begin()
        elif name == LAST_MEASURED:
            self.stop()

    def _begin(self) -> None:
        if not self._enabled or self._thread is not None or self._report is not None:
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
        """End sampling (idempotent) and return the report."""
        if self._report is not None:
            return self._report
        if self._thread is not None:
            self._stop.set()
            self._thread.join(JOIN_TIMEOUT_S)
            self._thread = None
            if not self._samples and self._note is None:
                self._note = "not measured: the steps ended before the first NVML sample"
        self._report = GpuUtilReport(list(self._samples), self.interval_s, self._note)
        return self._report

    def columns(self) -> Dict[str, Optional[float]]:
        return {"gpu_util_pct": self.stop().mean_pct}

    def record(self) -> Dict[str, Any]:
        report = self.stop()
        return {"samples_pct": report.samples, "interval_s": report.interval_s, "note": report.note}
