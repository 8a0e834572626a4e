"""GPU utilisation as the driver reports it (NVML), sampled on a thread over the measured steps.

NVML's "GPU utilisation" is the share of the last sample period (1/6 s to 1 s by GPU) in which a
kernel ran: what nvidia-smi prints, an independent check on the host-measured `accel_util_pct`.
It reads `pynvml` directly: torch.cuda.utilization() reads the same counter but creates a CUDA
context first, and DataLoader workers may still fork after the sampler starts.
"""

import os
import threading
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from pipebench.base.extras import install_line
from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED, Meter

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


def _uuid(nvml: Any, handle: Any) -> str:
    uuid = nvml.nvmlDeviceGetUUID(handle)
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


def _mig_devices(nvml: Any, gpu: Any) -> List[Any]:
    """The MIG instances of `gpu` (none when MIG is off or the call is not supported)."""
    try:
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)
    except nvml.NVMLError:
        return []
    found = []
    for index in range(count):
        with suppress(nvml.NVMLError):  # an empty slot
            found.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index))
    return found


def _old_style_mig(nvml: Any, gpu: Any, instance: str) -> Optional[Any]:
    """`MIG-GPU-<uuid>/<gpu instance>/<compute instance>` (drivers before R470): that instance of `gpu`."""
    gi, _, ci = instance.partition("/")
    for mig in _mig_devices(nvml, gpu):
        if (str(nvml.nvmlDeviceGetGpuInstanceId(mig)), str(nvml.nvmlDeviceGetComputeInstanceId(mig))) == (gi, ci):
            return mig
    return None


def nvml_device(nvml: Any, visible: Optional[str]) -> Tuple[Any, bool]:
    """(NVML handle, is a MIG instance) of CUDA device 0, as CUDA_VISIBLE_DEVICES names it: an
    index, a GPU UUID (or the unique prefix CUDA accepts), or a MIG instance's UUID, old style
    or new. NVML numbers devices its own way, so a UUID is resolved by UUID, never read as 0.
    Raises LookupError when no device NVML lists matches."""
    first = (visible or "0").split(",")[0].strip()
    if first.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(first)), False
    old_style = first.startswith("MIG-GPU-")
    wanted = first[len("MIG-"):].split("/", 1)[0] if old_style else first
    for index in range(nvml.nvmlDeviceGetCount()):
        gpu = nvml.nvmlDeviceGetHandleByIndex(index)
        if _uuid(nvml, gpu).startswith(wanted):
            if not old_style:
                return gpu, False
            mig = _old_style_mig(nvml, gpu, first.split("/", 1)[1] if "/" in first else "")
            if mig is not None:
                return mig, True
        if first.startswith("MIG-"):
            for mig in _mig_devices(nvml, gpu):
                if _uuid(nvml, mig) == first:
                    return mig, True
    raise LookupError(f"CUDA_VISIBLE_DEVICES={first!r} names no device NVML lists")


def _open_nvml():
    """(pynvml module, device handle), or (None, reason) when NVML cannot be read here."""
    if not torch.cuda.is_available():
        return None, "not measured: no CUDA"
    try:
        import pynvml
    except ImportError:
        return None, f"not measured: NVML bindings missing ({install_line(['gpu'])})"
    try:
        pynvml.nvmlInit()
        handle, mig = nvml_device(pynvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except pynvml.NVMLError as exc:
        return None, f"not measured: NVML unavailable ({exc})"
    except LookupError as exc:
        return None, f"not measured: {exc}"
    if mig:
        # NVML keeps no utilisation counter per MIG instance, and the whole GPU's counts the others' work.
        return None, "not measured: NVML reports no utilisation for a MIG instance"
    return pynvml, handle


class GpuUtilSampler(Meter):
    """A Meter: samples NVML utilisation every `interval_s` from the FIRST_MEASURED mark to the
    LAST_MEASURED mark (or stop()), so warm-up never dilutes it. NVML is opened at start(), since its
    init can take a good part of a second and the first mark is inside the window's clock.
    `enabled=False` (the consumer is not on CUDA) records nothing."""

    key = "gpu_util"

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, enabled: bool = True):
        self.interval_s = interval_s
        self._enabled = enabled
        self._samples: List[int] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._note: Optional[str] = None if enabled else "not measured: no CUDA consumer"
        self._report: Optional[GpuUtilReport] = None
        self._nvml: Optional[Tuple[Any, Any]] = None

    def start(self) -> None:
        """Open NVML; sampling spans the measured steps only, from the FIRST_MEASURED mark."""
        if not self._enabled:
            return
        nvml, handle = _open_nvml()
        if nvml is None:
            self._note = handle
        else:
            self._nvml = (nvml, handle)

    def mark(self, name: str) -> None:
        if name == FIRST_MEASURED:
            self._begin()
        elif name == LAST_MEASURED:
            self.stop()

    def _begin(self) -> None:
        if self._nvml is None or self._thread is not None or self._report is not None:
            return
        self._thread = threading.Thread(target=self._run, args=self._nvml, name="pipebench-gpu-util",
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
