"""`pipebench tune`: the pruning (each rule with its reason), the race on synthetic rounds of known truth,
the objectives, what it writes, its bad input, and one whole command at tiny settings."""

import csv
import dataclasses
import math
import re
from typing import Dict, List, Optional, Sequence

import numpy as np
import pytest
from omegaconf import OmegaConf

from pipebench.base.errors import ConfigError
from pipebench.base.extras import installed
from pipebench.cli.main import main
from pipebench.config.compose import job_spec_composer
from pipebench.config.verb_options import split_prefixed
from pipebench.model.costs import ChainCosts
from pipebench.model.judging import UNTOLD, Spread, judged
from pipebench.record.figures import Summary
from pipebench.record.jobs import JobResult
from pipebench.attach.export_config import write_exports
from pipebench.attach.export_pipeline import ExportedPipeline, measured_consumer
from pipebench.tune.chains import ChainSet
from pipebench.tune.chain_code import chain_code
from pipebench.tune.files import Tuned, best_config, paste_lines, unresolved_line, write_tune
from pipebench.tune.objective import Objective, probe_ties
from pipebench.tune.plan import TUNE_PREFIX, TuneOptions, job_overrides, store_point
from pipebench.tune.race import BUDGET, FAILED, LAST_STAGE, NOTHING_MEETS, RESOLVED, Entrants, RaceLimit, Schedule, judge, run_race
from pipebench.tune.recommend import bottleneck_note, crash_warning, recommend, sibling_warning, verify_line
from pipebench.tune.state import finished_trials, read_state, unfinished_folder, update_state
from pipebench.tune.space import (
    CHANGES_NOTHING,
    HOLDS_GIL,
    PAST_THE_BUDGET,
    PAST_THE_KNEE,
    ChainModel,
    Dimensions,
    Point,
    LADDER_CAP,
    MIN_RACED_POINTS,
    fit_budget,
    gil_share,
    grid,
    knee_workers,
    ladder_top,
    model_ladder,
    one_point_note,
    prune,
    thread_speedup_bound,
)

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

CORES = 2


def _costs(cpu_ms: float, wall_ms: float, consumer_ms: float = 0.0) -> ChainCosts:
    return ChainCosts(wall_ms, cpu_ms, consumer_ms, 0.0, 32, CORES, "workers=0")


# Busy: every ms of a sample is CPU (a pure-Python step). Sleepy: a sample waits 10 ms and spends 0.1 ms of CPU.
BUSY = ChainModel(_costs(10.0, 10.0))
SLEEPY = ChainModel(_costs(0.1, 10.0))
GIL = ChainModel(_costs(10.0, 10.0), ("BusyWait",), gil_share=1.0)
# The chain: a read that waits 8 ms, and a crop that holds the GIL 10% of the sample's time.
WAITS_WITH_A_GIL_STEP = ChainModel(_costs(2.0, 10.0), ("RegionRandomCrop",), gil_share=0.1)


def _dims(**given) -> Dimensions:
    values = dict(chains=("busy",), workers=(0, 1, 2, 4), backends=("dataloader",), prefetch_factors=(2,),
                  persistent_workers=(False,), pin_memory=(False,), batch_sizes=(32,))
    return Dimensions(**{**values, **given})


def _reasons(dropped) -> Dict[str, str]:
    return {d.point.name: d.reason for d in dropped}


# ---- the pruning, one rule at a time


def test_pin_memory_without_cuda_is_dropped_for_changing_nothing():
    kept, dropped = prune(grid(_dims(workers=(2,), pin_memory=(False, True))), {}, cuda=False)
    assert [p.pin_memory for p in kept] == [False]
    assert list(_reasons(dropped).values()) == ["pin_memory: no CUDA device here, so pinning does nothing"]
    assert [d.rule for d in dropped] == [CHANGES_NOTHING]
    kept, dropped = prune(grid(_dims(workers=(2,), pin_memory=(False, True))), {}, cuda=True)
    assert [p.pin_memory for p in kept] == [False, True] and not dropped


def test_workers_0_is_one_point_whatever_the_worker_settings():
    dims = _dims(workers=(0,), backends=("dataloader", "threads"), prefetch_factors=(2, 4),
                 persistent_workers=(False, True))
    kept, dropped = prune(grid(dims), {}, cuda=False)
    assert [p.name for p in kept] == ["busy-w0-dataloader-pf2-b32"]
    assert len(dropped) == 7
    assert all(r.startswith("workers=0: one in-process loop under every backend") and
               r.endswith("(raced as busy-w0-dataloader-pf2-b32)") for r in _reasons(dropped).values())


def test_persistent_workers_under_threads_is_dropped():
    kept, dropped = prune(grid(_dims(workers=(2,), backends=("threads",), persistent_workers=(False, True))), {},
                          cuda=False)
    assert [p.persistent_workers for p in kept] == [False]
    assert list(_reasons(dropped).values()) == [
        "persistent_workers: loader.backend=threads runs threads, and the setting is for worker processes"]


def test_threads_are_pruned_by_amdahls_bound_on_the_gil_share_not_by_one_gil_step():
    dims = _dims(chains=("gil", "sleepy"), workers=(2,), backends=("dataloader", "threads", "spdl"))
    kept, dropped = prune(grid(dims), {"gil": GIL, "sleepy": SLEEPY}, cuda=False)
    assert sorted(p.name for p in kept) == ["gil-w2-dataloader-pf2-b32", "sleepy-w2-dataloader-pf2-b32",
                                            "sleepy-w2-spdl-pf2-b32", "sleepy-w2-threads-pf2-b32"]
    reasons = _reasons(dropped)
    assert reasons["gil-w2-threads-pf2-b32"] == (
        "loader.backend=threads: 100% of gil's time holds the GIL (BusyWait), so by Amdahl's bound 2 threads reach "
        "at most 1x one (100 samples/s), short of the 200 worker processes would give")
    assert "gil-w2-spdl-pf2-b32" in reasons and {d.rule for d in dropped} == {HOLDS_GIL}
    # A chain that waits, with one step holding the GIL a tenth of its time: threads reach 1/0.1 = 10x one,
    # past the 1000 samples/s the cores give, so every count races; at a third of its time they stop at 3.3x.
    dims = _dims(chains=("io",), workers=(1, 2, 8, 12, 16), backends=("threads",))
    kept, dropped = prune(grid(dims), {"io": WAITS_WITH_A_GIL_STEP}, cuda=False)
    assert [p.workers for p in kept] == [1, 2, 8, 12, 16] and not dropped
    third = dataclasses.replace(WAITS_WITH_A_GIL_STEP, gil_share=0.3)
    kept, dropped = prune(grid(dims), {"io": third}, cuda=False)
    assert [p.workers for p in kept] == [1, 2] and [d.point.workers for d in dropped] == [8, 12, 16]
    assert thread_speedup_bound(0.1, 8) == 8 and thread_speedup_bound(0.1, 16) == 10
    assert thread_speedup_bound(0.0, 16) == 16


def test_the_gil_share_is_the_profiled_gil_holding_steps_share_of_the_chain():
    timing = dict(stage="sample", calls=1, ms_per_call_mean=1.0, ms_per_call_median=1.0, ms_per_sample=1.0)
    rows = [{"transform": "Read", "share_pct": 80.0, "thread_verdict": "waits", **timing},
            {"transform": "Crop", "share_pct": 12.0, "thread_verdict": "holds_gil", **timing},
            {"transform": "Mask", "share_pct": 8.0, "thread_verdict": "holds_gil", **timing}]

    def result(profile):
        return JobResult.from_stored({"summary": {}, "thread_profile": profile, "transforms": rows})

    assert gil_share([result({"steps": []})]) == pytest.approx(0.2)
    assert gil_share([result(None)]) == 0.0


def test_the_ladder_stops_where_the_model_puts_the_knee_bounded_by_memory_and_the_cap():
    # A pure-Python chain: its knee is the cores, and the ladder stops at twice them.
    assert ladder_top(BUSY.costs, 500.0, 20_000.0).workers == 2 * CORES
    # The chain: 10 ms of wall against 2 of CPU on 2 cores: knee 10, the ladder 1.5x past it.
    top = ladder_top(WAITS_WITH_A_GIL_STEP.costs, 500.0, 20_000.0)
    assert top.workers == 15 and top.why.startswith("the model's knee: 10 ms of wall against 2 ms of CPU")
    assert model_ladder(15, CORES) == (0, 1, 2, 4, 6, 8, 12, 15)
    assert model_ladder(4, CORES) == (0, 1, 2, 4) and model_ladder(25, CORES) == (0, 1, 2, 4, 6, 8, 12, 16, 25)
    # A chain that all but sleeps: the cap, unless memory runs out first.
    assert ladder_top(SLEEPY.costs, 100.0, 100_000.0).workers == LADDER_CAP
    memory = ladder_top(SLEEPY.costs, 1000.0, 8_000.0)
    assert memory.workers == 4 and memory.why.startswith("memory: 1000 MiB a worker")


def test_workers_past_the_cores_knee_are_not_raced_but_one_count_past_it_is():
    ladder = (0, 1, 2, 3, 4, 8)
    assert knee_workers(BUSY.costs, ladder) == CORES
    kept, dropped = prune(grid(_dims(workers=ladder)), {"busy": BUSY}, cuda=False)
    assert [p.workers for p in kept] == [0, 1, 2, 3]
    reasons = _reasons(dropped)
    assert sorted(reasons) == ["busy-w4-dataloader-pf2-b32", "busy-w8-dataloader-pf2-b32"]
    assert {d.rule for d in dropped} == {PAST_THE_KNEE}
    assert reasons["busy-w4-dataloader-pf2-b32"] == (
        "workers=4: the model has busy at 200 samples/s (cores-bound) from 2 workers (2 usable cores at 10 ms of "
        "CPU a sample); more workers only time-slice, and workers=3 checks it")
    # A chain that waits more than it computes scales past the cores: every count races.
    kept, dropped = prune(grid(_dims(chains=("sleepy",), workers=ladder)), {"sleepy": SLEEPY}, cuda=False)
    assert [p.workers for p in kept] == list(ladder) and not dropped


def test_the_budget_keeps_the_points_the_model_ranks_best_and_says_why_for_the_rest():
    points = grid(_dims(chains=("sleepy",), workers=(1, 2, 4, 8, 16)))
    kept, cut = fit_budget(points, {"sleepy": SLEEPY}, 40.0, lambda p: 10.0)
    assert [p.workers for p in kept] == [2, 4, 8, 16] and [d.point.workers for d in cut] == [1]
    assert cut[0].reason == ("one round of the budget fits 4 points, the model's best, at their workers' cost: the "
                             "model predicts 100 samples/s, below the last kept, sleepy-w2-dataloader-pf2-b32 (200)")
    assert {d.rule for d in cut} == {PAST_THE_BUDGET}
    # However little is left, the race gets the model's top MIN_RACED_POINTS.
    kept, cut = fit_budget(points, {"sleepy": SLEEPY}, 0.0, lambda p: 10.0)
    assert [p.workers for p in kept] == [4, 8, 16] and len(kept) == MIN_RACED_POINTS >= 3
    # Points the model cannot rank apart: the cut says so, and keeps fewer workers first.
    kept, cut = fit_budget(grid(_dims(workers=(2, 4, 8, 16))), {"busy": BUSY}, 30.0, lambda p: 10.0)
    assert [p.workers for p in kept] == [2, 4, 8] and cut[0].reason.endswith(
        "the model predicts it level with the last kept, busy-w8-dataloader-pf2-b32 (200 samples/s each), and "
        "keeps the fewer workers first")


# ---- the race on synthetic rounds of known truth


def _round(rate: float, rng: np.random.Generator, cv: float, cpu: float = 1.0, pss: float = 500.0,
           starvation: float = 50.0, ci: float = 0.0) -> Summary:
    """One round of `cv` noise; its interval `ci` of its rate either side (2 cv where 0)."""
    value = rate * float(np.exp(rng.normal(0, cv)))
    half = ci or 2 * cv
    return Summary.from_row({"samples_per_s": value, "samples_per_s_ci_low": value * (1 - half),
                             "samples_per_s_ci_high": value * (1 + half), "process_cpu_ms_per_sample": cpu,
                             "pss_mb_peak": pss, "starvation_pct": starvation})


class Planted:
    """A measurer of known truth: each point's true rate (and cost), rounds with `cv` noise that
    shrinks with the round's length; each job costs `job_s` on a fake clock. A point in `fails`
    returns no rounds for that many calls, as a point whose jobs ended without a result."""

    def __init__(self, truth: Dict[str, Dict[str, float]], cv: float = 0.05, job_s: float = 10.0, seed: int = 0,
                 fails: Optional[Dict[str, int]] = None):
        self.truth, self.cv, self.job_s = truth, cv, job_s
        self.rng = np.random.default_rng(seed)
        self.now = 0.0
        self.calls: List[Sequence[str]] = []
        self.fails = dict(fails or {})

    def clock(self) -> float:
        return self.now

    def __call__(self, names, rounds, length):
        self.calls.append(tuple(names))
        self.now += self.job_s * len(names) * rounds
        failing = {n for n in names if self.fails.get(n, 0) > 0}
        for name in failing:
            self.fails[name] -= 1
        return {n: [_round(rng=self.rng, cv=self.cv / math.sqrt(length), **self.truth[n]) for _ in range(rounds)]
                for n in names if n not in failing}


def _race(truth, objective=Objective(), deadline=10_000.0, workers=None, schedule=Schedule(job_s=10.0), **planted):
    measure = Planted(truth, **planted)
    workers = workers or {n: 2 for n in truth}
    outcome = run_race(Entrants(list(truth), workers), measure, objective, schedule, RaceLimit(deadline, measure.clock))
    return outcome, measure


def test_a_clear_winner_is_resolved_after_the_first_stage():
    outcome, measure = _race({"fast": {"rate": 1000.0}, "mid": {"rate": 500.0}, "slow": {"rate": 300.0}})
    assert outcome.stop == RESOLVED and outcome.survivors == ("fast",)
    assert len(outcome.stages) == 1 and measure.calls == [("fast", "mid", "slow")]
    assert outcome.out["slow"][0] == 1 and outcome.out["slow"][1].startswith("slower than fast beyond the noise")


def test_two_points_within_noise_are_both_kept_and_the_cheaper_is_recommended():
    truth = {"a": {"rate": 1000.0, "cpu": 2.0}, "b": {"rate": 1000.0, "cpu": 1.5}, "slow": {"rate": 400.0}}
    outcome, measure = _race(truth)
    assert outcome.stop == LAST_STAGE and set(outcome.survivors) == {"a", "b"}
    assert measure.calls[1:] == [tuple(outcome.stages[1].entrants)] * 2 and "slow" not in measure.calls[1]
    assert [len(outcome.rounds[n]) for n in ("a", "b", "slow")] == [6, 6, 2]
    chosen = recommend(outcome.rounds, outcome.survivors, {n: 2 for n in truth}, Objective())
    assert set(chosen.near) == {"a", "b"} and chosen.pick == "b" and chosen.met
    # The faster of two within noise is the best; the cheaper one is still the pick.
    rng = np.random.default_rng(0)
    rounds = {"fast": [_round(1010.0, rng, 0.0, cpu=2.0, ci=0.05), _round(1010.0, rng, 0.0, cpu=2.0, ci=0.05)],
              "lean": [_round(1000.0, rng, 0.0, cpu=1.5, ci=0.05), _round(1000.0, rng, 0.0, cpu=1.5, ci=0.05)]}
    chosen = recommend(rounds, ("fast", "lean"), {"fast": 2, "lean": 2}, Objective())
    assert (chosen.best, chosen.near, chosen.pick) == ("fast", ("fast", "lean"), "lean")


def test_a_spent_budget_stops_the_race_and_names_the_points_left():
    truth = {"a": {"rate": 1000.0}, "b": {"rate": 990.0}, "c": {"rate": 985.0}}
    # Stage 1 costs 3 points x 2 rounds x 10 s = 60 s; stage 2 would need about as much again.
    outcome, _ = _race(truth, deadline=100.0)
    assert outcome.stop == BUDGET and len(outcome.stages) == 1
    assert set(outcome.survivors) == {"a", "b", "c"} and not outcome.out


@pytest.mark.parametrize("reserve_jobs, stages, stop", [(0, 3, LAST_STAGE), (8, 1, BUDGET)])
def test_the_verification_reserve_counts_against_the_budget(reserve_jobs, stages, stop):
    """Stage 1 spends 40 s of 150; stage 2 takes 4 jobs of ~11 s (a round 1 s longer): they fit, but
    not beside 8 verification jobs."""
    truth = {"a": {"rate": 1000.0}, "b": {"rate": 1000.0}}
    measure = Planted(truth)
    outcome = run_race(Entrants(list(truth), {"a": 2, "b": 2}), measure, Objective(), Schedule(job_s=10.0),
                       RaceLimit(150.0, measure.clock, reserve_jobs))
    assert (len(outcome.stages), outcome.stop) == (stages, stop)


def _tuned(outcome, chosen, workers, objective=Objective()) -> Tuned:
    points = {n: Point("busy", w, "dataloader", 2, False, False, 32) for n, w in workers.items()}
    return Tuned("busy", objective, 300.0, 60.0, points, [], {}, outcome, chosen)


def test_a_point_whose_jobs_failed_runs_once_more_before_it_leaves():
    """A job can end without a result for a cause outside its point; the busy planted case lost its
    workers=1 and 2 points so, and the race called workers=0 'resolved'."""
    truth = {"w0": {"rate": 480.0}, "w2": {"rate": 900.0}}
    outcome, measure = _race(truth, fails={"w2": 1})
    assert measure.calls[:2] == [("w0", "w2"), ("w2",)]
    assert outcome.survivors == ("w2",) and outcome.stop == RESOLVED


def test_a_point_whose_jobs_fail_twice_is_out_in_tune_csv_and_the_race_is_not_called_resolved(tmp_path):
    workers = {"w0": 0, "w2": 2}
    outcome, measure = _race({"w0": {"rate": 480.0}, "w2": {"rate": 900.0}}, fails={"w2": 2}, workers=workers)
    assert measure.calls == [("w0", "w2"), ("w2",)]
    assert outcome.survivors == ("w0",) and outcome.out["w2"] == (1, FAILED)
    assert outcome.stop == "resolved among the points measured: one is left, and 1 point(s) whose jobs failed are out"
    chosen = recommend(outcome.rounds, outcome.survivors, workers, Objective())
    markdown = write_tune(tmp_path, _tuned(outcome, chosen, workers))
    with (tmp_path / "tune.csv").open() as handle:
        rows = {r["point"]: r for r in csv.DictReader(handle)}
    assert (rows["w2"]["stage"], rows["w2"]["rounds"]) == ("1", "0")
    assert rows["w2"]["verdict"] == f"out at stage 1: {FAILED}"
    assert "2 raced (1 never measured: their jobs failed twice)" in markdown


def test_points_the_race_could_not_resolve_are_not_recommended_for_being_cheaper(tmp_path):
    """The busy planted case at one short round: workers=0's interval is narrow, the worker points'
    span 2x (two worker cycles). Nothing is told apart; recommending the cheapest of them picked
    workers=0, the cheapest in CPU, though the workers measured twice its rate."""
    truth = {"w0": {"rate": 480.0, "cpu": 2.05, "pss": 400.0, "ci": 0.05},
             "w2": {"rate": 900.0, "cpu": 2.2, "pss": 440.0, "ci": 0.6},
             "w4": {"rate": 880.0, "cpu": 2.3, "pss": 480.0, "ci": 0.6}}
    workers = {"w0": 0, "w2": 2, "w4": 4}
    outcome, _ = _race(truth, workers=workers, schedule=Schedule(rounds_per_stage=1, max_stages=1, job_s=10.0))
    assert outcome.stop == LAST_STAGE and set(outcome.survivors) == set(truth)
    chosen = recommend(outcome.rounds, outcome.survivors, workers, Objective())
    assert chosen.pick in ("w2", "w4") and chosen.pick == chosen.best and "w0" in chosen.unresolved
    markdown = write_tune(tmp_path, _tuned(outcome, chosen, workers))
    assert unresolved_line(chosen, LAST_STAGE) in markdown
    assert f"the race stopped: {LAST_STAGE}" in unresolved_line(chosen, LAST_STAGE)
    # With the schedule (two rounds a stage, three stages) the workers are told apart from workers=0.
    outcome, _ = _race({n: {**t, "ci": 0.0} for n, t in truth.items()}, workers=workers, cv=0.1)
    chosen = recommend(outcome.rounds, outcome.survivors, workers, Objective())
    assert chosen.pick in ("w2", "w4") and outcome.out["w0"][1].startswith("slower than")
    # Where workers do not pay (a host whose other load takes a core), the measured tie goes to the cheapest.
    level = {n: {**t, "rate": 480.0, "ci": 0.03} for n, t in truth.items()}
    outcome, _ = _race(level, workers=workers, schedule=Schedule(rounds_per_stage=1, max_stages=1, job_s=10.0),
                       cv=0.01)
    chosen = recommend(outcome.rounds, outcome.survivors, workers, Objective())
    assert chosen.pick == "w0" and not chosen.unresolved and set(chosen.near) == set(truth)


def test_a_space_of_one_point_says_so_and_races_it():
    only = Point("busy", 2, "dataloader", 2, False, False, 32)
    assert one_point_note([only]) == (
        "the space has one point after pruning and the budget's cut: busy-w2-dataloader-pf2-b32; there is nothing "
        "to race it against, and it is measured all the same")
    assert one_point_note([only, only.serial()]) == ""
    outcome, measure = _race({only.name: {"rate": 500.0}})
    assert measure.calls == [(only.name,)] and outcome.survivors == (only.name,) and outcome.stop == RESOLVED


def test_the_verification_prints_the_gain_with_its_interval_and_compare_s_verdict():
    current = {0: 100.0, 1: 104.0, 2: 97.0, 3: 101.0}
    line = verify_line("w2", "w0", current, {0: 201.0, 1: 205.0, 2: 196.0, 3: 199.0})
    assert line == ("verified against your settings (w0), 4 interleaved rounds a side: w2 gives 1.99x their "
                    "samples/s (95% interval 1.97x to 2.02x): faster")
    assert verify_line("w2", "w0", current, {0: 101.0, 1: 103.0, 2: 98.0, 3: 100.0}).endswith(": no change")


# ---- the objectives


def test_a_starvation_target_picks_the_fewest_workers_that_meet_it():
    truth = {"w1": {"rate": 300.0, "starvation": 40.0}, "w2": {"rate": 600.0, "starvation": 8.0},
             "w4": {"rate": 640.0, "starvation": 3.0}}
    workers = {"w1": 1, "w2": 2, "w4": 4}
    objective = Objective(target_starvation_pct=10.0)
    outcome, _ = _race(truth, objective, workers=workers)
    assert outcome.survivors == ("w2",) and outcome.stop == RESOLVED
    assert outcome.out["w4"][1].startswith("the target is met with fewer workers (w2")
    assert outcome.out["w1"][1] == "starvation over the 10% target in all 2 rounds (least 40.0%)"
    assert recommend(outcome.rounds, outcome.survivors, workers, objective).pick == "w2"


def test_a_memory_cap_rules_out_the_fastest_point():
    truth = {"big": {"rate": 2000.0, "pss": 3000.0}, "small": {"rate": 1500.0, "pss": 1000.0}}
    objective = Objective(max_pss_gib=2.0)
    outcome, _ = _race(truth, objective)
    assert outcome.survivors == ("small",)
    assert outcome.out["big"][1] == "summed PSS 2.93 GiB over the 2 GiB cap"


def test_an_objective_nothing_meets_recommends_the_closest_and_says_why(tmp_path):
    truth = {"w1": {"rate": 300.0, "starvation": 60.0}, "w2": {"rate": 500.0, "starvation": 30.0}}
    objective = Objective(target_starvation_pct=10.0)
    outcome, _ = _race(truth, objective, workers={"w1": 1, "w2": 2})
    assert outcome.stop == NOTHING_MEETS and outcome.survivors == ("w2",)
    chosen = recommend(outcome.rounds, outcome.survivors, {"w1": 1, "w2": 2}, objective)
    assert not chosen.met and chosen.pick == "w2" and chosen.unmet == "starvation 30.0% over the 10% target"
    markdown = write_tune(tmp_path, _tuned(outcome, chosen, {"w1": 1, "w2": 2}, objective))
    assert "nothing met the objective; the closest: w2 (starvation 30.0% over the 10% target)" in markdown
    with (tmp_path / "tune.csv").open() as handle:
        verdicts = {r["point"]: r["verdict"] for r in csv.DictReader(handle)}
    assert verdicts["w2"] == "recommended: the closest, as nothing met the objective"
    assert verdicts["w1"].startswith("out at stage 1: nothing meets the objective: starvation over the 10% target")


def test_a_missed_starvation_target_says_what_the_model_needs():
    from pipebench.tune.session import _model_needs

    fed = ChainModel(_costs(10.0, 10.0, consumer_ms=30.0))
    line = _model_needs(Point("busy", 2, "dataloader", 2, False, False, 32), {"busy": fed}, 10.0)
    assert line == ("nothing kept starvation under 10%; the model: busy: 10 worker(s) and 10 usable core(s) keep the "
                    "consumer 90% busy; this host has 2 usable, 8 short: more cores, or a cheaper chain "
                    "(`pipebench explore`).")


def test_judge_keeps_a_point_whose_single_round_has_no_interval():
    """A round too short for an interval (nan bounds) cannot tell anything apart."""
    nan = float("nan")
    rounds = {n: [Summary.from_row({"samples_per_s": rate, "samples_per_s_ci_low": nan, "samples_per_s_ci_high": nan})]
              for n, rate in (("a", 1000.0), ("b", 500.0))}
    assert judge(rounds, {"a": 1, "b": 1}, Objective()).kept == ("a", "b")
    assert judged(Spread(1000.0, nan, nan, "", nan), Spread(500.0, 490.0, 510.0, "", 10)) == UNTOLD


@pytest.mark.skipif(not installed("optuna"), reason="tune.search=optuna needs Optuna")
def test_optuna_proposes_each_pruned_point_once_in_batches_and_races_them():
    from pipebench.tune.optuna_search import optuna_proposer

    kept, _ = prune(grid(_dims(chains=("sleepy",), workers=(0, 1, 2, 4), prefetch_factors=(2, 4))),
                    {"sleepy": SLEEPY}, cuda=False)
    truth = {p.name: {"rate": 100.0 * (1 + p.workers) + p.prefetch_factor} for p in kept}
    measure = Planted(truth)
    propose = optuna_proposer(kept, Objective(), batch=3, seed=0)
    outcome = run_race(Entrants([p.name for p in kept], {p.name: p.workers for p in kept}), measure, Objective(),
                       Schedule(job_s=10.0), RaceLimit(10_000.0, measure.clock), propose=propose)
    first = [n for call in measure.calls for n in call]
    assert set(first) == set(truth) and len(measure.calls[0]) == 3
    assert outcome.survivors[0].startswith("sleepy-w4-")


# ---- what it writes


def test_best_yaml_merged_onto_a_config_gives_the_recommended_settings():
    point = Point("yuv_mask", 4, "dataloader", 4, True, False, 64)
    with job_spec_composer() as compose_one:
        spec, _ = compose_one([])
    merged = OmegaConf.merge(OmegaConf.create({"workers": spec.workers, "loader": {"batch_size": 32}}),
                             OmegaConf.create(best_config(point, None)))
    assert merged.workers == 4 and merged.loader.batch_size == 64 and merged.loader.persistent_workers is True


def test_paste_lines_follow_the_backend_and_drop_worker_settings_without_workers():
    assert paste_lines(Point("c", 0, "dataloader", 2, False, False, 32)) == [
        "DataLoader(dataset, batch_size=32, shuffle=True, num_workers=0, pin_memory=False)"]
    assert "prefetch_factor=4, persistent_workers=True" in paste_lines(Point("c", 6, "dataloader", 4, True, True, 32))[0]
    assert any("method=\"thread\"" in line for line in paste_lines(Point("c", 6, "threads", 4, False, False, 32)))
    assert "concurrency=6" in paste_lines(Point("c", 6, "spdl", 2, False, False, 32))[-1]


def test_a_point_reaches_its_job_as_a_config_that_selects_its_chain_and_loader():
    point = Point("yuv_mask_fast", 3, "threads", 4, False, False, 16)
    store_point(point)
    with job_spec_composer() as compose_one:
        spec, _ = compose_one(["loader=seed", f"+tune_point={point.name}"])
    assert (spec.transform_name, spec.workers, spec.loader.backend, spec.loader.prefetch_factor,
            spec.loader.batch_size) == ("yuv_mask_fast", 3, "threads", 4, 16)


# ---- bad input: one line, exit 2, nothing run or written


@pytest.mark.parametrize("args, message", [
    (["tune.wrkers=[1]"], "tune.wrkers: no such key"),
    (["tune.search=grid"], "tune.search: must be one of race, optuna, got 'grid'"),
    (["--budget-s", "1"], r"--budget-s is too small to measure one round: at least \d+ s here"),
    (["--budget-s", "1e300"], r"--budget-s must be at most 604800 s \(a week\), got 1e\+300"),
    (["--target-starvation", "10", "consumer=none"], "--target-starvation needs a consumer to starve"),
    (["workers=0,2"], "tune starts from one setting, got a sweep of 2 jobs"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["tune", *args, "tune.variants=false", "results_dir=out"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipebench: error: ") and re.search(message, err), err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_unknown_objective_value_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["tune", "--target-starvation", "150"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "must be a percentage above 0 and below 100, got '150'")


def test_the_current_settings_read_as_they_run_and_the_jobs_lose_what_each_point_or_round_sets():
    assert Point("c", 0, "threads", 4, True, True, 32).as_run(cuda=False) == Point("c", 0, "dataloader", 2, False,
                                                                                    False, 32)
    assert Point("c", 2, "threads", 4, True, True, 32).as_run(cuda=True) == Point("c", 2, "threads", 4, False, True, 32)
    given = ["workers=4", "loader.backend=threads", "transform=x", "run.min_time_s=3", "run.thread_profile=true",
             "dataset=image_folder", "loader.shuffle=false", "run=quick"]
    assert job_overrides(given) == ["dataset=image_folder", "loader.shuffle=false", "run=quick"]


def test_tune_options_read_a_comma_list_as_a_list():
    options, rest = split_prefixed(["tune.workers=0,2,4", "workers=3"], TUNE_PREFIX, TuneOptions)
    assert options.workers == [0, 2, 4] and rest == ["workers=3"]
    with pytest.raises(ConfigError, match=r"tune\.workers\[0\]: Value 'a'"):
        split_prefixed(["tune.workers=[a]"], TUNE_PREFIX, TuneOptions)
    with pytest.raises(ConfigError, match=r"^tune\.workers must be >= 0 and <= 256, got 999$"):
        split_prefixed(["tune.workers=[999]"], TUNE_PREFIX, TuneOptions)


# ---- issue 54: the chain as code, resume, ties, crashes, the user's own step, the budget's limit


def test_the_chain_prints_as_the_code_that_builds_it_in_torchvision_s_terms():
    seed = {"per_sample": [{"_target_": "torchvision.transforms.PILToTensor"},
                           {"_target_": "torchvision.transforms.RandomCrop", "size": 256},
                           {"_target_": "pipebench.transforms.mask.RandomMask", "ratio": 0.25}],
            "per_batch": [{"_target_": "pipebench.transforms.color.BatchConvertColor"}]}
    assert chain_code(seed) == [
        "from pipebench.transforms.color import BatchConvertColor",
        "from pipebench.transforms.mask import RandomMask",
        "from torchvision import transforms",
        "# each sample, in the Dataset's __getitem__ (the workers)",
        "per_sample = transforms.Compose([", "    transforms.PILToTensor(),", "    transforms.RandomCrop(size=256),",
        "    RandomMask(ratio=0.25),", "])",
        "# each batch, after default_collate in the collate_fn",
        "per_batch = transforms.Compose([", "    BatchConvertColor(),", "])"]
    v2 = {"per_sample": [{"_target_": "torchvision.transforms.v2.ToDtype", "scale": True,
                          "dtype": {"_target_": "hydra.utils.get_object", "path": "torch.float32"}}], "per_batch": []}
    assert chain_code(v2) == ["import torch", "from torchvision.transforms import v2",
                              "# each sample, in the Dataset's __getitem__ (the workers)",
                              "per_sample = v2.Compose([", "    v2.ToDtype(scale=True, dtype=torch.float32),", "])"]


def test_tune_md_prints_a_variant_chain_as_code_and_a_run_line_into_its_own_config_folder(tmp_path):
    workers = {"w2": 2}
    outcome, _ = _race({"w2": {"rate": 500.0}}, workers=workers)
    chosen = recommend(outcome.rounds, outcome.survivors, workers, Objective())
    config = {"per_sample": [{"_target_": "torchvision.transforms.RandomCrop", "size": 8}], "per_batch": []}
    tuned = dataclasses.replace(_tuned(outcome, chosen, workers), chain_config=config)
    markdown = write_tune(tmp_path, tuned)
    assert "    transforms.RandomCrop(size=8)," in markdown
    assert f"--config-dir {tmp_path / 'conf'} " in markdown and f"--config-dir {tmp_path} " not in markdown
    assert OmegaConf.load(tmp_path / "conf" / "transform" / "busy.yaml").per_sample[0].size == 8
    mine = write_tune(tmp_path, _tuned(outcome, chosen, workers))
    assert "the chain: yours, unchanged (transform=busy)" in mine and "--config-dir" not in mine


def test_the_same_command_finds_its_unfinished_tune_and_its_plan(tmp_path):
    command = ["transform=busy", "--config-dir=", "objective=highest samples/s"]
    old, new, done, other = (tmp_path / f"2026120{i}-000000-tune-busy" for i in range(1, 5))
    for folder, key in ((old, command), (new, command), (done, command), (other, ["transform=other"])):
        folder.mkdir()
        update_state(folder, command=key, created=float(folder.name[:8]))
    (done / "tune.md").write_text("ended")
    (new / "race-1" / "job-0").mkdir(parents=True)
    (new / "race-1" / "job-0" / "result.json").write_text("{}")
    assert unfinished_folder(tmp_path, "*-tune-busy*", command) == new
    assert unfinished_folder(tmp_path, "*-tune-busy*", ["transform=busy"]) is None
    assert finished_trials(new) == 1
    chains = ChainSet(("busy", "busy+fast"), {"busy+fast": {"per_sample": [], "per_batch": []}},
                      {"busy": "base", "busy+fast": "identical"}, {"busy": (), "busy+fast": ("fast",)})
    update_state(new, chains=chains.record())
    assert ChainSet.read(read_state(new).chains) == chains
    assert read_state(new).command == tuple(command)  # the plan's fields are added, never lost


def test_a_probe_keeps_the_chains_its_one_job_cannot_tell_apart():
    def probe(rate, half):
        return [Summary.from_row({"samples_per_s": rate, "samples_per_s_ci_low": rate * (1 - half),
                                  "samples_per_s_ci_high": rate * (1 + half)})]

    # 282 against 278: the intervals are narrow, but one job each cannot tell a 1.4% gap.
    probes = {"a+region": probe(282.0, 0.005), "a+region+fast": probe(278.0, 0.005), "a": probe(150.0, 0.005)}
    assert probe_ties(probes, "a+region") == ["a+region", "a+region+fast"]


def test_a_tie_between_chains_goes_to_the_stricter_equivalence_and_says_so():
    truth = {"loose": {"rate": 500.0, "cpu": 1.0}, "strict": {"rate": 500.0, "cpu": 1.5}}
    workers = {"loose": 2, "strict": 2}
    outcome, _ = _race(truth, workers=workers, cv=0.001)
    equivalence = {"loose": "same distribution", "strict": "close (max |Δ| = 2)"}
    chosen = recommend(outcome.rounds, outcome.survivors, workers, Objective(), equivalence)
    assert chosen.pick == "strict" and chosen.stricter.startswith("strict is recommended over loose")
    assert "close (max |Δ| = 2) to yours" in chosen.stricter
    assert recommend(outcome.rounds, outcome.survivors, workers, Objective()).pick == "loose"


def test_a_crashed_probe_is_named_first_and_warns_on_the_siblings_it_shares_a_move_with(tmp_path):
    moves = {"a+region": ("region_decode",), "a+region+fast": ("region_decode", "fast"), "a+fast": ("fast",)}
    warning = sibling_warning("a+region", ["a+region+fast"], moves)
    assert warning.startswith("a+region shares a move with chain(s) whose probe crashed: a+region+fast (shares "
                              "region_decode)")
    assert sibling_warning("a", ["a+region+fast"], moves) == ""
    workers = {"w2": 2}
    outcome, _ = _race({"w2": {"rate": 500.0}}, workers=workers)
    chosen = recommend(outcome.rounds, outcome.survivors, workers, Objective())
    crash = crash_warning("a+region+fast", "its probe job ended without a result")
    markdown = write_tune(tmp_path, dataclasses.replace(_tuned(outcome, chosen, workers), warnings=[crash],
                                                        pick_warning=warning))
    assert markdown.splitlines()[2] == f"**warning: {crash}**"
    recommendation = markdown[markdown.index("## recommendation"):]
    assert f"**warning: {warning}**" in recommendation


def test_tune_says_when_the_loader_is_not_the_bottleneck_at_the_user_s_own_step():
    note = bottleneck_note(2.5, "measured, 4 round(s)", "consumer=emulated, 127.7 ms a step")
    assert note.startswith("the loader is not the bottleneck at your own step (consumer=emulated, 127.7 ms a step): "
                           "your settings starve it 2.5% of the time (measured, 4 round(s))")
    assert bottleneck_note(30.0, "measured", "x") == "" and bottleneck_note(math.nan, "measured", "x") == ""


def test_an_export_carries_the_script_s_measured_step_as_its_consumer(tmp_path):
    steps = [120.0, 125.0, 127.7, 130.0, 140.0]
    consumer = measured_consumer(steps)
    assert consumer["kind"] == "emulated" and consumer["step_ms"] == 127.7 and consumer["distribution"] == "normal"
    assert consumer["spread_ms"] == pytest.approx(5.0 / 1.349, abs=1e-3)
    assert measured_consumer([50.0, 50.0])["distribution"] == "fixed"
    exported = ExportedPipeline(None, (), {"batch_size": 8}, 2, (), consumer)
    printed = write_exports(tmp_path, [("train.py:57", exported)])
    assert any("consumer=train_57" in line for line in printed)
    with job_spec_composer() as compose_one:
        spec, _ = compose_one([f"hydra.searchpath=[file://{tmp_path}]", "consumer=train_57"])
    assert (spec.consumer.kind, spec.consumer.step_ms, spec.consumer.distribution) == ("emulated", 127.7, "normal")


