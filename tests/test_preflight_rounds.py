"""The checks before a sweep's jobs compose each job once, not once a round: its rounds differ by
`run.round` alone (pipebench.sweep.preflight)."""

from contextlib import contextmanager

from conftest import QUICK_RUN, TINY_DATASET

from pipebench.sweep import preflight as preflight_module
from pipebench.sweep.expand import expand_sweep, sweep_overrides


def test_each_job_is_composed_once_for_all_its_rounds_and_every_round_keeps_its_place(monkeypatch):
    composed = []
    real = preflight_module.job_spec_composer

    @contextmanager
    def counting():
        with real() as compose_one:
            yield lambda job: composed.append(job) or compose_one(job)

    monkeypatch.setattr(preflight_module, "job_spec_composer", counting)
    monkeypatch.setattr(preflight_module, "check_builds", lambda specs, ahead: None)
    jobs = expand_sweep(sweep_overrides([*TINY_DATASET, *QUICK_RUN, "workers=0,1", "rounds=3"]))
    checked = preflight_module.preflight(jobs)
    assert len(jobs) == 6 and len(checked) == 6
    assert [job[0] for job in composed] == ["run.round=0", "run.round=0"]  # one a job, its first round's
    assert [spec.workers for spec, _ in checked] == [0, 1] * 3 and all(spec.rounds == 3 for spec, _ in checked)
