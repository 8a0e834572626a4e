"""The extra passes after a job's measured repeats, each on a fresh loop of its own, so none
touches the measured figures: the torch.profiler trace (trace=torch, workers=0), the GPU trace and
sync probe on CUDA, the VizTracer timeline (trace=viztracer), each stepped by `run_steps`.
"""

import errno
import os
import shutil
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import torch

from pipebench.base.errors import PipebenchError, error_line
from pipebench.base.io import replacing, write_text_atomic
from pipebench.measure.gpu.session import GPU_TRACE_FILE, STEP_LABEL, LabelledConsumer, trace_steps
from pipebench.measure.job_run import JobRun
from pipebench.measure.runner import StepLoop
from pipebench.measure.steps import StepSample
from pipebench.measure.viztrace import TRACE_FILE as VIZTRACE_FILE
from pipebench.measure.viztrace import VizTraceSession
from pipebench.pipeline.build import JobParts
from pipebench.pipeline.loader_backends import build_backend
from pipebench.pipeline.timed_chain import set_profiling_labels

__all__ = ["AfterWindow", "after_window", "run_steps"]

# Rows of torch.profiler's key_averages table saved beside the trace.
PROFILE_TABLE_ROWS = 40
TORCH_TRACE_FILE, PROFILE_TABLE_FILE = "trace.json", "profile.txt"
# record_function label around each step of the single-process torch.profiler trace.
TORCH_STEP_LABEL = "step"
# What kineto's Chrome trace writer adds to the name it is given for the file it writes first.
KINETO_TEMP_SUFFIX = ".tmp"


def run_steps(loop: StepLoop, steps: int, label: Optional[str] = None,
              around: AbstractContextManager = nullcontext(), skip: int = 0) -> List[StepSample]:
    """Step a fresh `loop`: `skip` steps, then `steps` inside `around` (a profiler), each under the
    record_function `label` when given; close its stream. Returns the `steps`, on the GPU's clock
    under run.sync=async."""
    try:
        for _ in range(skip):
            loop.step(None)
        stepped = []
        loop.begin_window()
        with around:
            for _ in range(steps):
                with torch.profiler.record_function(label) if label else nullcontext():
                    stepped.append(loop.step(None))
        return loop.end_window(stepped)
    finally:
        loop.stream.close()


def _export(profiler: torch.profiler.profile, path: Path) -> Path:
    """The profiler's Chrome trace at `path`, whole, or a PipebenchError line naming it, with nothing
    left behind. kineto writes `NAME.tmp` and renames it, and a failed write (a full disk) it only
    logs, leaving that temporary and an empty file, so both are checked."""
    with replacing(path, ".json") as new:  # the exporter writes by name: a new file, renamed over
        leftover = Path(f"{new}{KINETO_TEMP_SUFFIX}")
        try:
            profiler.export_chrome_trace(str(new))
            failed = leftover.exists() or new.stat().st_size == 0
            line = _unwritten(path) if failed else ""
        finally:
            leftover.unlink(missing_ok=True)
        if failed:
            raise PipebenchError(line)
    return path


def _unwritten(path: Path) -> str:
    """The line for a trace the exporter could not write whole, made while its temporary still holds
    the space: a full disk as every full disk reads (errors.error_line), else what the exporter said."""
    full = shutil.disk_usage(path.parent).free == 0
    why = os.strerror(errno.ENOSPC) if full else "torch.profiler's exporter could not write it whole"
    return error_line(OSError(errno.ENOSPC if full else errno.EIO, why, str(path)))


@contextmanager
def _labelled(profiler: torch.profiler.profile, parts: JobParts) -> Iterator[None]:
    """`profiler` on, with the chain's steps labelled for it (record_function) while it records."""
    set_profiling_labels(parts.instrumented, parts.collate, True)
    try:
        with profiler:
            yield
    finally:
        set_profiling_labels(parts.instrumented, parts.collate, False)


def torch_profile(run: JobRun, job_dir: Path) -> Dict[str, str]:
    """In-process steps under torch.profiler, the chain's steps labelled: a Perfetto-loadable trace and its table."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    run_steps(run.kit.loop(), run.spec.run.profile_steps, TORCH_STEP_LABEL, around=_labelled(profiler, run.parts))
    trace = _export(profiler, job_dir / TORCH_TRACE_FILE)
    table = job_dir / PROFILE_TABLE_FILE
    write_text_atomic(table, profiler.key_averages().table(sort_by="cpu_time_total", row_limit=PROFILE_TABLE_ROWS))
    return {"trace": trace.name, "profile_table": table.name}


def gpu_trace(run: JobRun, job_dir: Path) -> None:
    """The GPU trace: the first batch and the warm-up (the start-up backlog) unprofiled, then whole
    worker cycles under a CPU+CUDA profile, so it stands for the steady state; the GPU session reads it."""
    kit = run.kit
    consumer = LabelledConsumer(run.parts.consumer)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA])
    traced = run_steps(kit.loop(consumer), trace_steps(kit.plan.cycle), STEP_LABEL, around=profiler,
                       skip=kit.plan.warmup + 1)
    run.meters.gpu.read_trace(_export(profiler, job_dir / GPU_TRACE_FILE), traced, consumer.last_batch)


def _viztraced_steps(run: JobRun, session: VizTraceSession) -> None:
    parts = run.parts
    loop = run.kit.loop(loader=build_backend(run.spec, parts.instrumented, parts.collate, trace_session=session))
    # The loop is not a start_main target: the session would keep it, and through it the loader.
    loop.trace = session.start_main(parts.instrumented, parts.collate)
    run_steps(loop, run.spec.run.profile_steps)
    # Returning drops the last reference to the loader, so persistent workers (which the loader
    # itself keeps) shut down here too, and every worker exits cleanly and writes its last part.


def viztrace(run: JobRun, job_dir: Path) -> Dict[str, Any]:
    """Steps on a fresh loader (fresh workers), traced by every process into `job_dir/viztrace.json`.
    Returns the session's summary (processes, slices, workers that did not close cleanly)."""
    session = VizTraceSession(mode="sparse")
    try:
        _viztraced_steps(run, session)
    finally:
        session.finish(job_dir)  # bounded: never waits past the session's finish_timeout_s
    return session.summary


@dataclass(frozen=True)
class AfterWindow:
    """What the extra passes left: result.json's `artifacts` (file names) and `viztrace` summary."""

    artifacts: Dict[str, str]
    viztrace: Optional[Dict[str, Any]]


def after_window(run: JobRun, job_dir: Path) -> AfterWindow:
    """The extra passes the job's settings ask for, after its measured repeats (none at
    run.profile_steps=0)."""
    spec = run.spec
    artifacts: Dict[str, str] = {}
    traced: Optional[Dict[str, Any]] = None
    if spec.run.profile_steps == 0:
        return AfterWindow(artifacts, traced)
    if spec.workers == 0 and spec.trace == "torch":
        artifacts = torch_profile(run, job_dir)
    if run.meters.gpu.on_cuda:
        gpu_trace(run, job_dir)
    if spec.trace == "viztracer":
        traced = viztrace(run, job_dir)
        artifacts = {"viztrace": VIZTRACE_FILE}
    return AfterWindow(artifacts, traced)
