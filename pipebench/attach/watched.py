"""What a watched loader measured (`pipebench.watch`, `pipebench attach`), as a frozen result and a results folder.

`WatchResult` freezes `pipebench.attach.watch`'s figures; `save_results` writes them in the project's
schema (one job-N/result.json a loader, then summary.csv and transforms.csv), so `pipebench report`
reads a watched run as it reads a sweep, its loaders told apart by their `LoaderIdentity` pairs.
"""

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Collection, Dict, Iterator, List, Mapping, Optional, Sequence

from torch.utils.data import DataLoader

from pipebench.base.typed_json import parse
from pipebench.attach.export_config import write_exports
from pipebench.attach.recorder import RecordSettings, Recorder, record_watch
from pipebench.attach.sinks.sink_set import SinkSpec, open_sinks
from pipebench.attach.watch import (
    DEFAULT_REPLAY,
    DEFAULT_SECONDS,
    DEFAULT_SKIP_STEPS,
    DEFAULT_STEPS,
    SITE_KEY,
    VIA_KEY,
    LoaderWatch,
    WatchWindow,
)
from pipebench.config.specs import USER_STEP
from pipebench.measure.fingerprint import fingerprint
from pipebench.measure.summarize import pass_records, rows_as_dicts
from pipebench.measure.window import window_record
from pipebench.record.jobs import JobIdentity, JobResult, varying_keys
from pipebench.record.results import write_invocation_tables, write_result

__all__ = ["Watched", "WatchedLoader", "WatchResult", "save_results", "watch", "watch_result", "write_jobs"]

# The job folders' prefix, as the launcher names them (record/results.py reads job-*/result.json).
JOB_FOLDER = "job-{num}"


@dataclass(frozen=True)
class WatchResult:
    """One watched loader's figures: rates over the steady steps (interval: batch means over whole cycles;
    NaN bounds where there is none, `record`'s ci_note says why), starvation = Σ wait / Σ (wait + step),
    `au_pct`, MLPerf Storage's accelerator utilisation over every measured step (`summarize.au_pct`: the
    run's first batch and the warm-up steps left out), the run's first batch, and `record`, its
    result.json. `name`: what tells it apart from the other loaders of its run (its creation site alone
    when nothing else is needed)."""

    name: str
    dataset_class: str
    workers: int
    steps_measured: int
    samples_per_s: float
    samples_per_s_ci: tuple
    batches_per_s: float
    batches_per_s_ci: tuple
    starvation_pct: float
    au_pct: float
    first_batch_s: float
    record: JobResult = field(repr=False)
    # With replay: the step's mean with the loader out of the way, and the speed-up a perfect
    # loader would give (the measured step with its wait / that); None without.
    replay_step_ms: Optional[float] = None
    headroom_x: Optional[float] = None

    @property
    def transforms(self) -> List[Mapping[str, Any]]:
        """The per-transform rows (transforms.csv's columns less `job`); empty without a recipe."""
        return list(self.record.transforms)

    def save(self, folder: "str | Path") -> Path:
        """Write this result as a one-job results folder that `pipebench report FOLDER` reads."""
        return save_results(folder, [self])


@dataclass(frozen=True)
class WatchedLoader:
    """What a watched job's config says of its loader (result.json's `config.loader`), in written order."""

    site: str
    via: Optional[str]
    iterated_at: Optional[str]
    created: Optional[int]
    dataset_class: str
    num_workers: int
    batch_size: Optional[int]
    persistent_workers: bool

    @classmethod
    def of(cls, record: JobResult) -> "WatchedLoader":
        """The loader of a watched job's result."""
        return parse(cls, record.config["loader"])


def watch_result(watch: LoaderWatch, job_num: int = 0) -> Optional[WatchResult]:
    """The frozen result of a watch; None when it measured no step."""
    summary, rows, window = watch.figures()
    if window is None:
        return None
    identity = watch.identity
    config = {"loader": asdict(WatchedLoader(watch.site, watch.via, identity.iterated_at, identity.order,
                                             watch.dataset_class, watch.workers, watch.batch_size, watch.persistent)),
              "window": asdict(watch.window),
              "recipe": None if watch.recipe is None else {"attr": watch.recipe.attr,
                                                          "not_opened": watch.recipe.not_opened}}
    columns = {"dataset": watch.dataset_class, "transform": None, "workers": watch.workers,
               "batch_size": watch.measured_batch_size(), "consumer": USER_STEP}
    overrides = tuple(f"{key}={value}" for key, value in identity.pairs().items())
    record = JobResult(summary, {"transforms": rows_as_dicts(rows), "passes": pass_records(window),
                                 "window": window_record(window), "first_batch_s_per_epoch": list(watch.first_batch_s),
                                 "meters": watch.meters.record()}).identified(
        JobIdentity(identity.label, job_num, overrides, config, {}, columns))
    row, extra = record.summary, record.summary.extra
    return WatchResult(name=_name(identity.pairs()), dataset_class=watch.dataset_class, workers=watch.workers,
                       steps_measured=row.steps, samples_per_s=row.samples_per_s,
                       samples_per_s_ci=(row.samples_per_s_ci_low, row.samples_per_s_ci_high),
                       batches_per_s=extra["batches_per_s"],
                       batches_per_s_ci=(extra["batches_per_s_ci_low"], extra["batches_per_s_ci_high"]),
                       starvation_pct=row.starvation_pct, au_pct=row.au_pct, first_batch_s=row.first_batch_s,
                       record=record, replay_step_ms=extra.get("replay_step_ms"),
                       headroom_x=extra.get("headroom_x"))


def save_results(folder: "str | Path", results: Sequence[WatchResult]) -> Path:
    """One job folder a result (numbered in order), the fingerprint of this host in each, then the
    folder's summary.csv and transforms.csv. Call once the loaders' workers are gone (the
    fingerprint may query the GPU)."""
    folder = Path(folder)
    host = fingerprint({"class": ", ".join(sorted({r.dataset_class for r in results}))}, "user")
    write_jobs(folder, [replace(r.record, identity=replace(r.record.identity, job_num=num),
                                sections={**r.record.sections, "fingerprint": host})
                        for num, r in enumerate(results)])
    return folder


def write_jobs(folder: Path, records: Sequence[JobResult]) -> None:
    """One job folder a record, numbered in order, then the folder's summary.csv and transforms.csv."""
    for num, record in enumerate(records):
        job_dir = folder / JOB_FOLDER.format(num=num)
        job_dir.mkdir(parents=True, exist_ok=True)
        write_result(job_dir, record.to_json())
    if records:
        write_invocation_tables(folder)


class Watched:
    """A loader, watched: iterate it instead of the loader; `result()` once the window is over. With
    a `Recorder`, every epoch is recorded too (pipebench.attach.recorder), until `close()`."""

    def __init__(self, loader: DataLoader, window: WatchWindow, recorder: Optional[Recorder] = None) -> None:
        self.loader = loader
        self.watch = LoaderWatch(loader, window, export=True)
        self.recorder = recorder
        self._recorded = None if recorder is None else record_watch(recorder, self.watch)

    def __iter__(self) -> Iterator[Any]:
        epoch = self.watch.epoch(lambda: iter(self.loader))
        return epoch if self._recorded is None else self._recorded.epoch(epoch, getattr(self.loader, "batch_size", None))

    def __len__(self) -> int:
        return len(self.loader)

    def __enter__(self) -> "Watched":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Put the loader's transform recipe and collate back now (the watch does it by itself once
        its window and replay are over); a recording writes its partial window and ends."""
        self.watch.close()
        if self.recorder is not None:
            self.recorder.close()

    def export_config(self, folder: "str | Path") -> List[str]:
        """Write the loader's dataset, transform and loader configs into `folder` (a `--config-dir`);
        the lines `pipebench attach --export-config` prints: what was left out and why, and the
        `pipebench run` / `pipebench explore` commands. See docs/attach.md."""
        if self.watch.exported is None:
            raise ValueError(f"{self.watch.dataset_class} is not a torch DataLoader: there is no dataset or "
                             "recipe to export")
        return write_exports(folder, [(self.watch.site, self.watch.exported)])

    @property
    def done(self) -> bool:
        """Whether the measured window is over (batches now pass through unmeasured)."""
        return self.watch.done

    def result(self) -> WatchResult:
        """The figures of the steps measured so far. Raises ValueError when none was."""
        result = watch_result(self.watch)
        if result is None:
            raise ValueError(f"the loader created at {self.watch.site} has no measured step yet "
                             f"({self.watch.window.skip_steps} warm-up steps come first)")
        return result


def watch(loader: DataLoader, steps: int = DEFAULT_STEPS, skip_steps: int = DEFAULT_SKIP_STEPS,
          seconds: float = DEFAULT_SECONDS, replay: int = DEFAULT_REPLAY, record: bool = False,
          out: "str | Path | None" = None, settings: Optional[RecordSettings] = None,
          sinks: Optional[SinkSpec] = None) -> Watched:
    """Wrap `loader` so the loop that iterates the wrapper is measured: see `Watched`. With `record`,
    the whole run is recorded into `out` (series.csv, events.csv, capture-N/; docs/attach.md) until
    `close()` (or the `with` block's end), each window pushed to `sinks` too (TensorBoard, MLflow, W&B,
    Prometheus; a sink that cannot start raises ConfigError here).

    >>> watched = pipebench.watch(loader, steps=100)
    >>> for batch in watched: train_step(batch)
    >>> watched.result().save("results/watch")
    """
    recorder = None
    if record:
        if out is None:
            raise ValueError("pipebench.watch(record=True) needs out=FOLDER, where series.csv is written as the run goes")
        Path(out).mkdir(parents=True, exist_ok=True)
        recorder = Recorder(Path(out), settings or RecordSettings(), sink=open_sinks(sinks) if sinks else None)
    return Watched(loader, WatchWindow(steps, skip_steps, seconds, replay), recorder)


def results_of(watches: Sequence[LoaderWatch]) -> List[WatchResult]:
    """The results of the watches that measured a step, numbered in order, each named by its creation
    site and the pairs of its identity that differ between them."""
    results = [r for r in (watch_result(w, num) for num, w in enumerate(watches)) if r is not None]
    differ = varying_keys([r.record.pairs for r in results])
    return [replace(r, name=_name(r.record.pairs, differ)) for r in results]


def _name(pairs: Mapping[str, str], differ: Collection[str] = ()) -> str:
    """A loader's name: its creation site (and `via`), and the pairs of its identity in `differ`."""
    kept = (SITE_KEY, VIA_KEY, *differ)
    return ",".join(f"{key}={value}" for key, value in pairs.items() if key in kept)


def summary_line(result: WatchResult) -> Dict[str, Any]:
    """One row of attach's printed table (the rate alone where it has no interval)."""
    low, high = result.samples_per_s_ci
    interval = f" ({low:.1f}..{high:.1f})" if math.isfinite(low) and math.isfinite(high) else ""
    return {"loader": result.name, "dataset": result.dataset_class, "workers": result.workers,
            "steps": result.steps_measured, "samples_per_s": f"{result.samples_per_s:.1f}{interval}",
            "batches_per_s": f"{result.batches_per_s:.2f}", "starvation_pct": f"{result.starvation_pct:.1f}",
            "au_pct": f"{result.au_pct:.1f}", "first_batch_s": f"{result.first_batch_s:.3f}",
            "headroom_x": "" if result.headroom_x is None else f"{result.headroom_x:.2f}"}
