"""How `pipebench tune` keeps its budget (issue 54: 579 s spent against --budget-s 300): a stage's
sweep starts no job past the deadline (the launcher, on a fake clock), the race judges what a cut
stage measured and does not call the jobs it never reached failures, and a point's job is priced by
its workers' start-ups, so the budget's cut and the race's stages fit in the first place."""

from pathlib import Path
from typing import List

import pytest
from omegaconf import OmegaConf

from hydra_plugins.pipebench_launcher import subprocess_launcher
from hydra_plugins.pipebench_launcher.subprocess_launcher import SubprocessLauncher
from pipebench.base.errors import SweepIncomplete
from pipebench.model.costs import ChainCosts
from pipebench.record.figures import Summary
from pipebench.sweep.launch import Into, run_command
from pipebench.tune.files import Tuned, tune_markdown
from pipebench.tune.job_cost import NON_PERSISTENT_STARTS, WORKER_START_S, job_seconds
from pipebench.tune.objective import Objective
from pipebench.tune.race import BUDGET, FAILED, UNRUN, Entrants, RaceLimit, Schedule, run_race
from pipebench.tune.space import MIN_RACED_POINTS, ChainModel, Point, fit_budget

JOB_S = 10.0


class _Loader:
    """Hydra's config loader as the launcher calls it: each job's config from its overrides."""

    def load_sweep_config(self, config, overrides):
        number = int(overrides[0].split("=")[1])
        return OmegaConf.create({"hydra": {"job": {"id": 0, "num": 0}, "sweep": {"subdir": f"job-{number}"},
                                           "overrides": {"task": list(overrides)}},
                                 "run": {"on_job_error": "continue", "stop_at_target": False, "round": 0}})


def _launcher(tmp_path: Path, monkeypatch, deadline: float, done=(), failing=()) -> SubprocessLauncher:
    """A launcher whose jobs each take JOB_S on a fake clock, without processes; `done` jobs were
    finished by an earlier run, `failing` ones exit 1."""
    time = [0.0]
    launcher = SubprocessLauncher(deadline=deadline, clock=lambda: time[0])
    launcher.config = OmegaConf.create({"hydra": {"hydra_logging": None, "verbose": False,
                                                  "sweep": {"dir": str(tmp_path)}}})
    launcher.hydra_context = type("Context", (), {"config_loader": _Loader()})()
    launcher.task_function = print
    launcher.started: List[str] = []

    def run_job(sweep_config):
        launcher.started.append(str(sweep_config.hydra.sweep.subdir))
        time[0] += JOB_S
        return 1 if sweep_config.hydra.sweep.subdir in failing else 0

    monkeypatch.setattr(launcher, "_run_job_process", run_job)
    monkeypatch.setattr(subprocess_launcher, "setup_globals", lambda: None)
    monkeypatch.setattr(subprocess_launcher, "configure_log", lambda *args: None)
    monkeypatch.setattr(subprocess_launcher, "job_already_done",
                        lambda job_dir, task, config: job_dir.name in done)
    return launcher


def test_a_sweep_starts_no_job_past_its_deadline_and_names_those_it_left_out(tmp_path, monkeypatch, capsys):
    """Jobs of 10 s against a deadline at 25 s: the third starts at 20 s and finishes; the fourth
    would start at 30 s. A job an earlier run finished costs nothing, so it still counts."""
    launcher = _launcher(tmp_path, monkeypatch, deadline=25.0, done={"job-4"})
    runs = launcher.launch([[f"n={i}"] for i in range(6)], 0)
    assert launcher.started == ["job-0", "job-1", "job-2"]
    assert [list(r.overrides) for r in runs] == [["n=0"], ["n=1"], ["n=2"], ["n=4"]]
    out = capsys.readouterr().out
    assert "pipebench: the sweep's deadline passed: 2 job(s) not started: 4/6 n=3; 6/6 n=5" in out
    assert "[job 4/6]" not in out and "[job 5/6] n=4 (already done, skipped)" in out


def test_jobs_left_out_at_the_deadline_are_not_failures(tmp_path, monkeypatch):
    launcher = _launcher(tmp_path, monkeypatch, deadline=15.0, failing={"job-0"})
    with pytest.raises(SweepIncomplete) as raised:
        launcher.launch([[f"n={i}"] for i in range(4)], 0)
    assert [f.job for f in raised.value.failures] == ["1/4 n=0"] and not raised.value.not_run
    # No deadline: every job runs, as before.
    launcher = _launcher(tmp_path, monkeypatch, deadline=None)
    assert len(launcher.launch([[f"n={i}"] for i in range(4)], 0)) == 4 and len(launcher.started) == 4


@pytest.mark.slow  # Hydra composes the sweep: about 2 s
def test_a_stage_passes_its_deadline_to_the_launcher_which_hydra_accepts(tmp_path, capsys):
    """The seam end to end, without a job: a deadline already past leaves the whole sweep out."""
    folder = tmp_path / "race-1"
    folder.mkdir()
    status = run_command(["dataset=random_tensors", "workers=0,1", "run.progress=false",
                          f"results_dir={tmp_path}"], None, into=Into(folder, stage=True, deadline=0.0))
    assert status == 0 and not list(folder.glob("job-*/result.json"))
    line = next(l for l in capsys.readouterr().out.splitlines() if "deadline passed" in l)
    assert line.startswith("pipebench: the sweep's deadline passed: 2 job(s) not started: 1/2 dataset=")
    assert " workers=0 " in line and "; 2/2 " in line and " workers=1 " in line


# ---- the race, cut at the deadline


class CutAt:
    """A measurer on a fake clock: each job costs `job_s`; jobs run in the sweep's order (rounds
    interleaved) and none starts at or past `deadline`, as the launcher does."""

    def __init__(self, rates, deadline: float, job_s: float = JOB_S):
        self.rates, self.deadline, self.job_s = rates, deadline, job_s
        self.now = 0.0
        self.calls = []

    def clock(self) -> float:
        return self.now

    def __call__(self, names, rounds, length):
        self.calls.append(tuple(names))
        found = {}
        for _ in range(rounds):
            for name in names:
                if self.now >= self.deadline:
                    return found
                self.now += self.job_s
                rate = self.rates[name]
                found.setdefault(name, []).append(Summary.from_row(
                    {"samples_per_s": rate, "samples_per_s_ci_low": rate * 0.9, "samples_per_s_ci_high": rate * 1.1,
                     "process_cpu_ms_per_sample": 1.0, "pss_mb_peak": 500.0, "starvation_pct": 50.0}))
        return found


def test_a_stage_cut_at_the_deadline_is_judged_on_what_it_measured_and_its_unrun_points_are_not_failures():
    rates = {"a": 1000.0, "b": 990.0, "c": 500.0, "d": 400.0, "e": 300.0}
    measure = CutAt(rates, deadline=25.0)
    outcome = run_race(Entrants(list(rates), dict.fromkeys(rates, 2)), measure, Objective(), Schedule(job_s=JOB_S),
                       RaceLimit(25.0, measure.clock))
    assert measure.calls == [tuple(rates)]  # no second call for the points the sweep never reached
    assert outcome.stop == BUDGET and len(outcome.stages) == 1
    assert outcome.out["e"] == (1, UNRUN) and outcome.out["d"] == (1, UNRUN)
    assert set(outcome.survivors) == {"a", "b"} and outcome.out["c"][1].startswith("slower than a")
    assert FAILED not in {why for _, why in outcome.out.values()}
    points = {n: Point("busy", 2, "dataloader", 2, False, False, 32) for n in rates}
    text = tune_markdown(Path("."), Tuned("busy", Objective(), 35.0, 40.0, points, [], {}, outcome, None), [], "")
    assert "5 raced (2 never measured: the budget was spent before their jobs ran)" in text


def test_the_race_prices_a_stage_by_what_the_last_one_measured_against_the_estimate():
    """Stage 1's jobs take 30 s against an estimate of 10: stage 2 (3 points x 2 rounds of ~11 s
    estimated) fits the 300 s budget at the estimate, not at the measured price."""
    rates = {"a": 1000.0, "b": 1000.0, "c": 1000.0}
    for job_s, stages in ((JOB_S, 2), (3 * JOB_S, 1)):
        measure = CutAt(rates, deadline=1e9, job_s=job_s)
        outcome = run_race(Entrants(list(rates), dict.fromkeys(rates, 2), dict.fromkeys(rates, JOB_S)), measure,
                           Objective(), Schedule(max_stages=2, job_s=JOB_S), RaceLimit(300.0, measure.clock))
        assert len(outcome.stages) == stages and outcome.job_s == job_s


# ---- a point's job, priced by its workers


def _point(workers: int, persistent: bool = True, backend: str = "dataloader") -> Point:
    return Point("sleepy", workers, backend, 2, persistent, False, 32)


def test_a_jobs_estimate_grows_with_its_worker_starts():
    assert job_seconds(_point(0), JOB_S) == JOB_S
    assert job_seconds(_point(16), JOB_S) == JOB_S + 16 * WORKER_START_S
    assert job_seconds(_point(16, persistent=False), JOB_S) == JOB_S + 16 * WORKER_START_S * NON_PERSISTENT_STARTS
    assert job_seconds(_point(16, persistent=False), JOB_S) > job_seconds(_point(16), JOB_S) > JOB_S
    assert job_seconds(_point(16, persistent=False, backend="threads"), JOB_S) == JOB_S


def test_the_budgets_cut_counts_each_points_own_job():
    """Issue 54's space: 12-21 workers, half of them not persistent. Priced at the probe's job, 300 s
    held all twelve; at their workers' cost, the ones the model ranks best until the seconds run out."""
    model = ChainModel(ChainCosts(10.0, 2.0, 0.0, 0.0, 32, 2, "workers=0"))
    points = [_point(w, p) for w in (12, 16, 21) for p in (True, False)]
    flat, _ = fit_budget(points, {"sleepy": model}, 300.0, lambda p: 2 * JOB_S)
    priced, cut = fit_budget(points, {"sleepy": model}, 300.0, lambda p: 2 * job_seconds(p, JOB_S))
    assert len(flat) == len(points) and MIN_RACED_POINTS <= len(priced) < len(points)
    assert sum(2 * job_seconds(p, JOB_S) for p in priced) <= 300.0
    assert cut and all(d.reason.startswith(f"one round of the budget fits {len(priced)} points") for d in cut)
