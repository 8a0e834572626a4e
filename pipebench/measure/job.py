"""One benchmark job: build the pipeline, measure it, and return its record.

Writing the record and printing it belong to the job the task function runs (pipebench.sweep.one_job).
"""

from pathlib import Path

from pipebench.base.cores import usable_cores
from pipebench.base.errors import report_error, warn
from pipebench.config.specs import PROCESSES, JobSpec
from pipebench.measure.after_window import after_window
from pipebench.measure.distributed.multirank import measure_multirank
from pipebench.measure.fingerprint import job_fingerprint
from pipebench.measure.guard import job_guard
from pipebench.measure.job_run import JobRun, job_run
from pipebench.measure.job_series import job_series, sink_timings, write_job_series
from pipebench.measure.meter import add_notes
from pipebench.measure.repeats import measure_repeats
from pipebench.record.figures import Summary
from pipebench.record.jobs import JobResult
from pipebench.measure.host_load import PROCESS_CPU_COLUMN
from pipebench.measure.thread_profile import profile_wanted, thread_profile_pass
from pipebench.storage.page_cache import prepare_cache
from pipebench.measure.storage_io import file_read_columns
from pipebench.measure.summarize import (
    epoch_size,
    pass_records,
    rows_as_dicts,
    summary_row,
    transform_rows,
    worker_breakdown,
)
from pipebench.measure.window import window_record
from pipebench.storage.dataset_contract import told
from pipebench.storage.shared_link import opened_link

# Failures listed by name in result.json; the count covers all of them.
MAX_LISTED_FAILURES = 20


def measure_job(spec: JobSpec, job_dir: Path) -> JobResult:
    """Run every repeat of one job inside its guard (pipebench.measure.guard) and return its result
    record (without identity fields)."""
    with job_guard(spec, on_stuck=lambda line: report_error(line, job_dir)) as watchdog:
        run = job_run(spec, watchdog)
        return _measure_job(run, job_dir)


def _measure_job(run: JobRun, job_dir: Path) -> JobResult:
    spec, parts, kit, sink, meters = run.spec, run.parts, run.kit, run.sink, run.meters
    for line in told(parts.dataset).notes():
        warn(line)  # what the dataset left out of what it was given (an image folder's loops, say)
    cache = prepare_cache(parts.dataset, spec.storage, watchdog=kit.watchdog)
    for line in cache.notices:
        print(line, flush=True)
    repeats = measure_repeats(kit, meters, meters.coverage, sink)
    extra = after_window(run, job_dir)
    batch_steps = [*parts.collate.steps, *kit.device_chain.steps]
    rows = transform_rows(sink, parts.instrumented.steps, batch_steps)
    cores = usable_cores()
    # Last of the extra passes: it calls the steps alone, on threads of this process.
    kind = parts.loader.worker_kind
    threads = None
    if profile_wanted(spec, kind):
        threads = thread_profile_pass(spec, parts.instrumented, parts.collate, kind, cores)
    batches_per_epoch, samples_per_epoch = epoch_size(spec, parts.dataset, parts.loader)
    # A thread backend starts a fresh pool every epoch, whatever loader.persistent_workers says.
    persistent = spec.worker_kind == PROCESSES and spec.workers > 0 and spec.loader.persistent_workers
    summary = summary_row(repeats.window, rows, sink, spec.workers, cores, len(repeats.skipped),
                          persistent=persistent, samples_per_epoch=samples_per_epoch,
                          batches_per_epoch=batches_per_epoch, target_steps=kit.plan.window,
                          worker_kind=spec.worker_kind)
    rate = Summary.from_row(summary).samples_per_s
    summary.update(pin_memory=kit.non_blocking, **cache.columns(), **file_read_columns(sink, rate))
    for meter in meters:
        summary.update(meter.columns())
    summary[PROCESS_CPU_COLUMN] = meters.host_load.cpu_ms_per_sample(repeats.marked_samples)
    add_notes(summary, meters)
    passes = pass_records(repeats.window)
    write_job_series(job_dir, job_series(job_dir.name, 0, passes, kit.plan.cycle,
                                         [s.name for s in [*parts.instrumented.steps, *batch_steps]], sink_timings(sink)))
    return JobResult(summary, {
        **{meter.key: meter.record() for meter in meters},
        "transforms": [{**measured, **(threads.columns(row.stage, row.transform) if threads else {})}
                       for row, measured in zip(rows, rows_as_dicts(rows))],
        "thread_profile": threads.record() if threads else None,
        "workers_breakdown": worker_breakdown(sink, list(repeats.passes)),
        "consumer_report": parts.consumer.report(),
        "passes": passes,
        "window": window_record(repeats.window),
        "skipped": [f._asdict() for f in repeats.skipped[:MAX_LISTED_FAILURES]],
        "artifacts": extra.artifacts,
        "viztrace": extra.viztrace,
        "pin_memory_effective": kit.non_blocking,
        "fingerprint": job_fingerprint(spec, parts.dataset),
    })


def measure(spec: JobSpec, job_dir: Path) -> JobResult:
    """One job's record: in this process, or on `distributed.nproc` ranks through torchrun; with the
    host's shared link (dataset.storage.shared_mb_per_s) opened for the job, its workers and ranks."""
    with opened_link(spec) as linked:
        if linked.distributed.nproc > 1:
            return measure_multirank(linked, job_dir)
        return measure_job(linked, job_dir)
