"""Sweep axes: workers=auto, Hydra's range() and choice(), and every loader.* key reaching the DataLoader."""

import sys

import pytest
from conftest import QUICK_RUN, TINY_DATASET

from pipebench.base.errors import ConfigError
from pipebench.cli import main as cli_main
from pipebench.config.compose import job_spec_composer
from pipebench.config.sweep_axes import expand_auto_workers, worker_ladder
from pipebench.pipeline.build import build_pipeline
from pipebench.pipeline.loader_backends import build_loader
from pipebench.report.comparison import identity
from pipebench.sweep import launch
from pipebench.sweep.expand import expand_sweep, sweep_overrides
from pipebench.sweep.preflight import preflight

# Loader keys a user sweeps, each with two values that differ from the defaults' and each other.
LOADER_AXES = {
    "loader.batch_size": ("4", "8"),
    "loader.prefetch_factor": ("1", "3"),
    "loader.pin_memory": ("true", "false"),
    "loader.persistent_workers": ("true", "false"),
    "loader.multiprocessing_context": ("spawn", "forkserver"),
}


@pytest.mark.parametrize("cores, ladder", [(1, [0, 1, 2]), (2, [0, 1, 2, 4]), (3, [0, 1, 2, 3, 4, 6]),
                                           (6, [0, 1, 2, 4, 6, 8, 12]), (16, [0, 1, 2, 4, 8, 16, 32])])
def test_worker_ladder_goes_to_twice_the_cores(cores, ladder):
    assert worker_ladder(cores) == ladder


def test_auto_workers_expand_before_the_up_front_checks(monkeypatch):
    """With 3 usable cores faked, preflight is handed the six real jobs, not `workers=auto`."""
    assert expand_auto_workers(["transform=a,b", "workers=auto"], 3) == ["transform=a,b", "workers=0,1,2,3,4,6"]
    seen = []

    def fake_preflight(jobs, ahead, baseline):
        seen.extend(jobs)
        raise ConfigError("stop before measuring")

    monkeypatch.setattr(launch, "usable_cores", lambda: 3)
    monkeypatch.setattr(launch, "preflight", fake_preflight)
    monkeypatch.setattr(sys, "path", list(sys.path))  # run puts the working directory on sys.path
    assert cli_main.main(["run", "workers=auto", *TINY_DATASET]) == 2
    assert [identity(job, {})["workers"] for job in seen] == ["0", "1", "2", "3", "4", "6"]


@pytest.mark.parametrize("override, values", [
    ("workers=range(0,3)", ["0", "1", "2"]),
    ("workers=range(1,9,step=3)", ["1", "4", "7"]),
    ("loader.batch_size=choice(4,8,16)", ["4", "8", "16"]),
])
def test_range_and_choice_sweep(override, values):
    jobs = expand_sweep(sweep_overrides([override, *TINY_DATASET]))
    key = override.split("=")[0]
    assert [identity(job, {})[key] for job in jobs] == values
    specs = preflight(jobs)  # every job composes and passes the checks
    got = [s.workers if key == "workers" else s.loader.batch_size for s, _ in specs]
    assert got == [int(v) for v in values]


@pytest.mark.parametrize("key", LOADER_AXES)
def test_each_loader_axis_sweeps_into_the_dataloader(key):
    values = LOADER_AXES[key]
    jobs = expand_sweep(sweep_overrides([*TINY_DATASET, *QUICK_RUN, "workers=1", f"{key}={','.join(values)}"]))
    assert len(jobs) == len(values)
    field = key.split(".")[1]
    with job_spec_composer() as compose_one:
        for job, value in zip(jobs, values):
            spec = compose_one(job)[0]
            _, instrumented, collate = build_pipeline(spec)
            loader = build_loader(spec, instrumented, collate)
            chosen = getattr(spec.loader, field)
            assert str(chosen).lower() == value
            if field == "multiprocessing_context":
                assert loader.multiprocessing_context.get_start_method() == value
            elif field != "pin_memory":  # pinning needs an accelerator; the spec keeps the request
                assert getattr(loader, field) == chosen
