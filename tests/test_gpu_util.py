"""The NVML utilisation sampler: its thread, its notes when there is nothing to read, and a real GPU."""

import time
from types import SimpleNamespace

import pytest
import torch

from cuda_marks import NEEDS_CUDA
from pipebench.measure.gpu import util as gpu_util
from pipebench.measure.gpu.util import GpuUtilSampler
from pipebench.measure.meter import FIRST_MEASURED


class FakeNvml:
    """Stands in for pynvml: utilisation readings from a list, then an error."""

    class NVMLError(Exception):
        pass

    def __init__(self, readings):
        self.readings = list(readings)
        self.calls = 0

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.calls += 1
        if not self.readings:
            raise self.NVMLError("gone")
        return SimpleNamespace(gpu=self.readings.pop(0), memory=0)


def test_sampler_collects_readings_on_its_thread_until_stopped(monkeypatch):
    fake = FakeNvml([10, 30, 50, 70])
    opened = []
    monkeypatch.setattr(gpu_util, "_open_nvml", lambda: opened.append(1) or (fake, "handle"))
    sampler = GpuUtilSampler(interval_s=0.01)
    sampler.start()  # a Meter's start: nothing sampled before the first measured step
    assert fake.calls == 0
    sampler.mark(FIRST_MEASURED)
    # Opened once, at start: NVML's init must not land in the window, whose clock runs at the mark.
    assert opened == [1]
    deadline = time.monotonic() + 5
    while fake.calls <= 4 and time.monotonic() < deadline:  # the 5th call raises
        time.sleep(0.01)
    report = sampler.stop()
    assert report.samples == [10, 30, 50, 70] and report.mean_pct == 40
    assert report.note == "NVML stopped answering (gone)"


def test_sampler_stopped_before_its_first_reading_says_so(monkeypatch):
    monkeypatch.setattr(gpu_util, "_open_nvml", lambda: (FakeNvml([50]), "handle"))
    sampler = GpuUtilSampler(interval_s=60)
    sampler.start()
    sampler.mark(FIRST_MEASURED)
    report = sampler.stop()
    assert report.samples == [] and report.mean_pct is None and "before the first NVML sample" in report.note


def test_disabled_sampler_reads_nothing(monkeypatch):
    monkeypatch.setattr(gpu_util, "_open_nvml", lambda: pytest.fail("must not open NVML"))
    sampler = GpuUtilSampler(enabled=False)
    sampler.start()
    assert sampler.stop().note == "not measured: no CUDA consumer"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_the_report_is_empty_with_a_note():
    sampler = GpuUtilSampler(interval_s=0.01)
    sampler.start()
    sampler.mark(FIRST_MEASURED)
    report = sampler.stop()
    assert report.samples == [] and report.mean_pct is None and report.note == "not measured: no CUDA"


@NEEDS_CUDA
def test_real_nvml_reads_a_busy_gpu():
    pytest.importorskip("pynvml", reason="pip install 'pipebench[gpu]' for NVML")
    x = torch.randn(4096, 4096, device="cuda")
    sampler = GpuUtilSampler(interval_s=0.05)
    sampler.start()
    sampler.mark(FIRST_MEASURED)
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        x = x @ x
        x = x / x.norm()
    torch.cuda.synchronize()
    report = sampler.stop()
    assert report.note is None and len(report.samples) >= 10
    assert max(report.samples) > 50, report.samples


class FakeNvmlDevices:
    """Stands in for pynvml's device listing: NVML indices that differ from the visible order,
    UUIDs as bytes (older bindings) or str, and MIG instances under the second GPU."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.gpus = [SimpleNamespace(uuid=b"GPU-aaaa-0000", migs=[]),
                     SimpleNamespace(uuid="GPU-bbbb-1111", migs=[None, SimpleNamespace(uuid="MIG-cccc-2222", gi=3, ci=0)])]

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle):
        return handle.uuid

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu):
        if not gpu.migs:
            raise self.NVMLError("Not Supported")
        return len(gpu.migs)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu, index):
        if gpu.migs[index] is None:
            raise self.NVMLError("Not Found")
        return gpu.migs[index]

    def nvmlDeviceGetGpuInstanceId(self, mig):
        return mig.gi

    def nvmlDeviceGetComputeInstanceId(self, mig):
        return mig.ci


def test_the_nvml_device_is_resolved_by_index_uuid_or_mig_uuid_never_read_as_index_0():
    nvml = FakeNvmlDevices()
    gpus, mig = nvml.gpus, nvml.gpus[1].migs[1]
    assert gpu_util.nvml_device(nvml, None) == (gpus[0], False)
    assert gpu_util.nvml_device(nvml, "1,0") == (gpus[1], False)
    assert gpu_util.nvml_device(nvml, "GPU-bbbb-1111,GPU-aaaa-0000") == (gpus[1], False)
    assert gpu_util.nvml_device(nvml, "GPU-bbbb") == (gpus[1], False)  # the unique prefix CUDA accepts
    assert gpu_util.nvml_device(nvml, "GPU-aaaa-0000") == (gpus[0], False)  # bytes from older bindings
    assert gpu_util.nvml_device(nvml, "MIG-cccc-2222") == (mig, True)
    assert gpu_util.nvml_device(nvml, "MIG-GPU-bbbb-1111/3/0") == (mig, True)  # before driver R470
    with pytest.raises(LookupError, match="GPU-ffff"):
        gpu_util.nvml_device(nvml, "GPU-ffff")


def test_a_mig_instance_or_an_unknown_uuid_leaves_utilisation_unmeasured_with_a_note(monkeypatch):
    nvml = FakeNvmlDevices()
    nvml.nvmlInit = lambda: None
    monkeypatch.setattr(gpu_util.torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-cccc-2222")
    assert gpu_util._open_nvml() == (None, "not measured: NVML reports no utilisation for a MIG instance")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ffff")
    assert gpu_util._open_nvml() == (None, "not measured: CUDA_VISIBLE_DEVICES='GPU-ffff' names no device NVML lists")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb-1111")
    assert gpu_util._open_nvml() == (nvml, nvml.gpus[1])
