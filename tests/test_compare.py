"""`pipebench compare`: verdicts on synthetic results folders, and one real end-to-end slowdown."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest
from conftest import PIPEBENCH_SCRIPT, TINY_DATASET, results_folder
from known_cost_kit import known_cost
from stored_results import result_record, write_record

from pipebench.cli.compare import compare_main
from pipebench.cli.main import main
from pipebench.record.jobs import job_key
from pipebench.record.results import CALIBRATION_FILE
from pipebench.regress.compare import (
    CLAIMED_FALSE_ALARM_RATE,
    DEFAULT_THRESHOLD,
    EXIT_INCOMPARABLE,
    EXIT_OK,
    EXIT_REGRESSION,
    FASTER,
    HOST_BUSIER,
    INCOMPARABLE,
    NO_CHANGE,
    NOISY,
    SLOWER,
    JobRuns,
    Run,
    compare_runs,
    load_run,
    write_comparison,
)

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

JOB = "transform=yuv_mask,workers=0"
BASE_RATE = 1000.0  # samples/s
STEPS, BATCH = 8, 32
FINGERPRINT = {"torch": "2.4.0", "cpu_model": "AMD EPYC", "usable_cores": 2, "cpu_count": 2,
               "dataset": {"name": "random_tensors", "length": 512}, "git_commit": "abc"}
CONFIG = {"transform": {"per_sample": [{"_target_": "BusyWait", "ms": 1.0}]}, "workers": 0,
          "run": {"repeats": 5, "progress": True}, "results_dir": "results"}


def write_run(folder: Path, rates: Dict[str, Sequence[float]], fingerprint: Optional[dict] = None,
              config: Optional[dict] = None, calibration_s: Optional[float] = None, starvation: float = 0.5) -> Path:
    """A results folder with one result.json a job, one pass per rate."""
    for num, (label, job_rates) in enumerate(rates.items()):
        write_record(folder, result_record(num, rates=job_rates, batch=BATCH, steps=STEPS, starvation=starvation,
                                           config=config or CONFIG, fingerprint=fingerprint or FINGERPRINT, job=label))
    (folder / "summary.csv").write_text("job\n")
    if calibration_s is not None:
        (folder / CALIBRATION_FILE).write_text(json.dumps({"score_s": calibration_s, "samples_s": [calibration_s] * 5}))
    return folder


def noisy_rates(rng: np.random.Generator, mean: float, cv: float, n: int) -> list:
    return list(mean * (1 + cv * rng.standard_normal(n)))


def memory_run(rates: Sequence[float]) -> Run:
    job = JobRuns(JOB, tuple(rates), tuple(50.0 for _ in rates), CONFIG, FINGERPRINT)
    return Run(Path("mem"), {JOB: job}, None)


@pytest.mark.parametrize("cv,min_no_change", [(0.04, 0.9), (0.05, 0.7)])
def test_aa_false_alarm_rate_within_claim(cv, min_no_change):
    """200 A/A comparisons at 5 repeats: false faster/slower <= the claimed rate; the rest mostly `no change`.

    Measured over 2000 draws: 0% false verdicts at 4% CV (96% no change), 0.25% at 5% CV (79% no change).
    """
    rng = np.random.default_rng(1)
    verdicts = [compare_runs(memory_run(noisy_rates(rng, BASE_RATE, cv, 5)),
                             memory_run(noisy_rates(rng, BASE_RATE, cv, 5))).jobs[0].verdict for _ in range(200)]
    false_alarms = sum(v in (FASTER, SLOWER) for v in verdicts) / len(verdicts)
    assert false_alarms <= CLAIMED_FALSE_ALARM_RATE
    assert verdicts.count(NO_CHANGE) / len(verdicts) >= min_no_change


def test_injected_slowdown_is_slower_and_exits_1(tmp_path, capsys):
    rng = np.random.default_rng(2)
    base = write_run(tmp_path / "base", {JOB: noisy_rates(rng, BASE_RATE, 0.04, 5)})
    cur = write_run(tmp_path / "cur", {JOB: noisy_rates(rng, 0.8 * BASE_RATE, 0.04, 5)})
    job = compare_runs(load_run(str(base)), load_run(str(cur))).jobs[0]
    assert job.verdict == SLOWER and job.ci_high < 1 and job.ratio == pytest.approx(0.8, abs=0.06)
    assert compare_main(str(base / "summary.csv"), str(cur), DEFAULT_THRESHOLD, False, str(tmp_path / "out")) == EXIT_REGRESSION
    out = capsys.readouterr().out
    assert "1 slower" in out and "| slower |" in out
    csv_text = (tmp_path / "out" / "compare.csv").read_text()
    assert csv_text.startswith("job,") and ",slower," in csv_text


def test_speedup_is_faster_and_exits_0(tmp_path):
    rng = np.random.default_rng(3)
    base = write_run(tmp_path / "base", {JOB: noisy_rates(rng, BASE_RATE, 0.03, 5)})
    cur = write_run(tmp_path / "cur", {JOB: noisy_rates(rng, 1.3 * BASE_RATE, 0.03, 5)})
    assert compare_runs(load_run(str(base)), load_run(str(cur))).jobs[0].verdict == FASTER
    assert compare_main(str(base), str(cur), DEFAULT_THRESHOLD, False, None) == EXIT_OK


@pytest.mark.parametrize("field,change", [
    ("torch", {"fingerprint": {"torch": "2.5.0"}}),
    ("cpu_model", {"fingerprint": {"cpu_model": "Intel Xeon"}}),
    ("usable_cores", {"fingerprint": {"usable_cores": 4}}),
    ("dataset", {"fingerprint": {"dataset": {"name": "random_tensors", "length": 1024}}}),
    ("config.transform.per_sample.0.ms", {"config": {"transform": {"per_sample": [{"_target_": "BusyWait",
                                                                                    "ms": 2.0}]}}}),
])
def test_mismatch_exits_2_naming_the_field(tmp_path, capsys, field, change):
    fingerprint = {**FINGERPRINT, **change.get("fingerprint", {})}
    config = {**CONFIG, **change.get("config", {})}
    base = write_run(tmp_path / "base", {JOB: [BASE_RATE] * 5})
    cur = write_run(tmp_path / "cur", {JOB: [BASE_RATE] * 5}, fingerprint=fingerprint, config=config)
    assert compare_main(str(base), str(cur), DEFAULT_THRESHOLD, False, None) == EXIT_INCOMPARABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pipebench: error:") and field in err[0]
    assert compare_runs(load_run(str(base)), load_run(str(cur))).jobs[0].verdict == INCOMPARABLE


def test_allow_mismatch_compares_and_says_so(tmp_path, capsys):
    base = write_run(tmp_path / "base", {JOB: [BASE_RATE] * 5})
    cur = write_run(tmp_path / "cur", {JOB: [BASE_RATE] * 5}, fingerprint={**FINGERPRINT, "torch": "2.5.0"})
    assert compare_main(str(base), str(cur), DEFAULT_THRESHOLD, True, None) == EXIT_OK
    out = capsys.readouterr().out
    assert "WARNING: fingerprint mismatch, compared anyway" in out and "torch" in out
    assert "| no change |" in out


def test_ignored_config_keys_and_other_fingerprint_fields_do_not_mismatch(tmp_path):
    config = copy.deepcopy(CONFIG)
    config["run"]["progress"], config["results_dir"] = False, "elsewhere"
    base = write_run(tmp_path / "base", {JOB: [BASE_RATE] * 5})
    cur = write_run(tmp_path / "cur", {JOB: [BASE_RATE] * 5}, config=config,
                    fingerprint={**FINGERPRINT, "git_commit": "def"})
    assert compare_runs(load_run(str(base)), load_run(str(cur))).mismatch == ()


def test_noisy_run_is_noisy_not_a_verdict():
    """CV 25% with 3 repeats a side: never faster/slower, and `noisy` in most draws."""
    rng = np.random.default_rng(4)
    verdicts = [compare_runs(memory_run(noisy_rates(rng, BASE_RATE, 0.25, 3)),
                             memory_run(noisy_rates(rng, BASE_RATE, 0.25, 3))).jobs[0].verdict for _ in range(50)]
    assert FASTER not in verdicts and SLOWER not in verdicts
    assert verdicts.count(NOISY) >= 40


def test_calibration_removes_a_uniformly_slower_machine(tmp_path):
    """Current machine 10% slower overall: raw ratio 0.9, normalised 1.0, verdict `no change`."""
    rng = np.random.default_rng(5)
    base_rates = noisy_rates(rng, BASE_RATE, 0.01, 5)
    base = write_run(tmp_path / "base", {JOB: base_rates}, calibration_s=0.100)
    cur = write_run(tmp_path / "cur", {JOB: [0.9 * r for r in base_rates]}, calibration_s=0.100 / 0.9)
    comparison = compare_runs(load_run(str(base)), load_run(str(cur)))
    job = comparison.jobs[0]
    assert job.ratio == pytest.approx(0.9) and job.normalised_ratio == pytest.approx(1.0)
    assert comparison.normalised and job.verdict == NO_CHANGE
    # A real 20% pipeline slowdown on that slower machine still reads as `slower`.
    cur2 = write_run(tmp_path / "cur2", {JOB: [0.9 * 0.8 * r for r in noisy_rates(rng, BASE_RATE, 0.01, 5)]},
                     calibration_s=0.100 / 0.9)
    assert compare_runs(load_run(str(base)), load_run(str(cur2))).jobs[0].verdict == SLOWER


def test_a_calibration_glitch_cannot_invent_a_regression(tmp_path):
    """Measured here: two runs of the same code, the calibration 10% quicker in the second."""
    rates = [BASE_RATE * f for f in (1.0, 1.02, 0.99, 1.01, 0.98)]
    base = write_run(tmp_path / "base", {JOB: rates}, calibration_s=0.100)
    cur = write_run(tmp_path / "cur", {JOB: [0.97 * r for r in rates]}, calibration_s=0.090)
    job = compare_runs(load_run(str(base)), load_run(str(cur))).jobs[0]
    assert job.normalised_ratio < 0.9, "the normalised ratio alone would call it slower"
    assert job.verdict == NO_CHANGE


def test_without_calibration_normalised_is_unavailable_and_raw_drives_verdict(tmp_path):
    base = write_run(tmp_path / "base", {JOB: [BASE_RATE * f for f in (1.0, 1.01, 0.99, 1.0, 1.02)]},
                     calibration_s=0.1)
    cur = write_run(tmp_path / "cur", {JOB: [0.9 * BASE_RATE * f for f in (0.8, 0.81, 0.79, 0.8, 0.82)]})
    comparison = compare_runs(load_run(str(base)), load_run(str(cur)))
    assert not comparison.normalised and np.isnan(comparison.jobs[0].normalised_ratio)
    assert comparison.jobs[0].verdict == SLOWER
    md, _ = write_comparison(comparison, str(tmp_path / "out"))
    assert "Normalised ratios unavailable" in md.read_text()


def test_rounds_merge_into_one_job_with_more_repeats(tmp_path):
    assert job_key("run.round=2,transform=x") == "transform=x"
    assert job_key("dataset.shape=[3,32,32],run.round=10,workers=0") == "dataset.shape=[3,32,32],workers=0"
    config = copy.deepcopy(CONFIG)
    config["run"]["round"] = 1
    base = write_run(tmp_path / "base", {f"run.round={k},{JOB}": [BASE_RATE] * 2 for k in range(3)}, config=config)
    run = load_run(str(base))
    assert list(run.jobs) == [JOB] and len(run.jobs[JOB].samples_per_s) == 6
    cur = write_run(tmp_path / "cur", {JOB: [BASE_RATE] * 5})
    assert compare_runs(run, load_run(str(cur))).mismatch == ()


def test_starvation_change_in_points(tmp_path):
    base = write_run(tmp_path / "base", {JOB: [BASE_RATE] * 5}, starvation=0.40)
    cur = write_run(tmp_path / "cur", {JOB: [BASE_RATE] * 5}, starvation=0.55)
    assert compare_runs(load_run(str(base)), load_run(str(cur))).jobs[0].starvation_change_pts == pytest.approx(15.0)


def test_job_in_one_run_only_is_incomparable(tmp_path, capsys):
    base = write_run(tmp_path / "base", {JOB: [BASE_RATE] * 5, "workers=4": [BASE_RATE] * 5})
    cur = write_run(tmp_path / "cur", {JOB: [BASE_RATE] * 5})
    verdicts = {j.job: j.verdict for j in compare_runs(load_run(str(base)), load_run(str(cur))).jobs}
    assert verdicts == {JOB: NO_CHANGE, "workers=4": INCOMPARABLE}
    assert compare_main(str(base), str(cur), DEFAULT_THRESHOLD, False, None) == EXIT_OK


@pytest.mark.parametrize("case", ["unreadable", "no_common_jobs"])
def test_incomparable_input_exits_2(tmp_path, capsys, case):
    base = write_run(tmp_path / "base", {JOB: [BASE_RATE] * 5})
    if case == "unreadable":
        cur = tmp_path / "missing"
    else:
        cur = write_run(tmp_path / "cur", {"workers=4": [BASE_RATE] * 5})
    assert compare_main(str(base), str(cur), DEFAULT_THRESHOLD, False, None) == EXIT_INCOMPARABLE
    assert capsys.readouterr().err.startswith("pipebench: error:")


def _chain_config_dir(root: Path, ms: float) -> Path:
    chain = root / "transform"
    chain.mkdir(parents=True)
    (chain / "cmp_chain.yaml").write_text(
        f"per_sample:\n  - _target_: pipebench.transforms.synthetic.BusyWait\n    ms: {ms}\nper_batch: []\n")
    return root


# The real runs' command: one round of a 1 ms-a-sample chain, as short as a verdict allows.
REAL_RUN = [*TINY_DATASET, "transform=cmp_chain", "consumer=none", "workers=0", "loader.batch_size=16",
            "run.repeats=5", "run.steps=8", "run.min_time_s=0", "run.warmup_steps=1", "run.profile_steps=0",
            "run.progress=false", "trace=none"]


def _real_run(root: Path, ms: float, capsys) -> Path:
    """`pipebench run REAL_RUN` of a BusyWait of `ms` in this process (its job in a job process, as from
    the console script, whose start-up no meter reads): its results folder."""
    conf = _chain_config_dir(root / "conf", ms)
    assert main(["run", "--config-dir", str(conf), *REAL_RUN, f"results_dir={root / 'results'}"]) == 0, \
        capsys.readouterr().err
    return results_folder(capsys.readouterr().out)


@pytest.fixture(scope="module")
def quiet_one_ms_runs() -> List[Path]:
    """The folders of this module's quiet real runs of the 1.0 ms chain, the latest last: the busy-host
    test compares against the one the slower-transform test measured in its own attempt, the same
    command, rather than pay for its own (5 s of a test that runs alone)."""
    return []


@pytest.mark.slow
@known_cost
def test_real_runs_flag_a_25pct_slower_transform(tmp_path, capsys, quiet_one_ms_runs):
    """Two real runs with the same overrides; only the config dir's BusyWait cost differs (1.0 vs 1.25 ms).

    The job's config then differs, as it must: compare refuses it naming exactly that key (torch, CPU,
    cores and dataset agree between two real runs), and with --allow-mismatch calls it `slower`.
    """
    base, cur = (str(_real_run(tmp_path / name, ms, capsys)) for name, ms in (("base", 1.0), ("cur", 1.25)))
    assert compare_main(base, cur, DEFAULT_THRESHOLD, False, None) == EXIT_INCOMPARABLE
    err = capsys.readouterr().err
    assert "config.transform.per_sample.0.ms" in err and "torch" not in err and "dataset" not in err
    assert compare_main(base, cur, DEFAULT_THRESHOLD, True, None) == EXIT_REGRESSION
    out = capsys.readouterr().out
    assert "| slower |" in out and "compared anyway" in out
    quiet_one_ms_runs.append(Path(base))


def test_one_round_a_side_says_rounds_not_an_old_file_and_host_load_explains_a_slowdown(tmp_path, capsys):
    """Folders of one round each: the CPU signal is off because of the rounds, and the line says
    so. A throughput drop that goes with 1.5 of 2 CPUs of other load on the slower side is the host."""
    rng = np.random.default_rng(5)
    quiet, busy = ({"host_other_cpu_cores": load} for load in (0.05, 1.5))
    records = {"base": (BASE_RATE, quiet), "cur": (0.5 * BASE_RATE, busy), "cur_quiet": (0.5 * BASE_RATE, quiet)}
    for name, (rate, summary) in records.items():
        write_record(tmp_path / name, result_record(0, rates=noisy_rates(rng, rate, 0.03, 5), batch=BATCH, steps=STEPS,
                                                    config=CONFIG, fingerprint=FINGERPRINT, job=JOB, summary=summary))
    busier = compare_runs(load_run(str(tmp_path / "base")), load_run(str(tmp_path / "cur")))
    assert (busier.jobs[0].verdict, busier.jobs[0].wall_verdict) == (HOST_BUSIER, SLOWER)
    assert busier.jobs[0].current_host_other_cores == pytest.approx(1.5)
    assert compare_runs(load_run(str(tmp_path / "base")), load_run(str(tmp_path / "cur_quiet"))).jobs[0].verdict == SLOWER
    assert compare_main(str(tmp_path / "base"), str(tmp_path / "cur"), DEFAULT_THRESHOLD, False, None) == EXIT_OK
    out = capsys.readouterr().out
    assert "a side has 1 round(s)" in out and "rounds=N" in out and "written before" not in out
    assert "| host busier | wall+host load |" in out


def test_results_without_cpu_time_still_say_they_predate_the_signal(tmp_path, capsys):
    for name in ("base", "cur"):
        write_record(tmp_path / name, result_record(0, rates=[BASE_RATE] * 5, config=CONFIG, fingerprint=FINGERPRINT,
                                                    job=JOB, summary={"cpu_ms_per_sample": float("nan")}))
    assert compare_main(str(tmp_path / "base"), str(tmp_path / "cur"), DEFAULT_THRESHOLD, False, None) == EXIT_OK
    assert "results written before the CPU-time signal" in capsys.readouterr().out


def _run_spun_through_the_first_job(args: Sequence[str], cwd: Path) -> Tuple[int, str, str]:
    """`pipebench ARGS` with CPU spinners on twice the cores from its first job's start until its table
    prints (the job measured and written): its exit status, stdout and stderr. Spun from the command's
    start, its imports and checks, which no meter reads, took three times as long: 10 s more of a test
    that runs alone; spun on to its end, its report and plots took 2 s more."""
    spinners: List[subprocess.Popen] = []
    err_path = cwd / "spun.stderr"
    try:
        with err_path.open("w") as err, subprocess.Popen(
                [str(PIPEBENCH_SCRIPT), *args], cwd=cwd, stdout=subprocess.PIPE,
                stderr=err, text=True) as proc:
            lines = []
            for line in proc.stdout:  # stderr goes to a file: a full pipe there could not stall this loop
                lines.append(line)
                if line.startswith("[job 1/1]") and not spinners:
                    # Each in a session of its own: with the kernel's autogroup scheduling a session
                    # shares the CPU as one, so spinners in the test's session would barely touch the job's.
                    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                                for _ in range(2 * (os.cpu_count() or 1))]
                elif line.startswith("## ") and spinners:
                    _stop(spinners)
    finally:
        _stop(spinners)
    assert spinners, "the run printed no [job 1/1] line"
    return proc.returncode, "".join(lines), err_path.read_text()


def _stop(spinners: Sequence[subprocess.Popen]) -> None:
    for spinner in spinners:
        spinner.kill()
        spinner.wait()


@pytest.mark.slow
def test_a_spinning_process_beside_one_real_run_is_the_host_not_a_regression(tmp_path, capsys, quiet_one_ms_runs):
    """Two real one-round runs of one chain; CPU spinners beside the second take most of the cores.
    Throughput alone would call it `slower`; the host-load meter saw the spinners, so `host busier`."""
    base = quiet_one_ms_runs[-1] if quiet_one_ms_runs else _real_run(tmp_path / "base", 1.0, capsys)
    conf = _chain_config_dir(tmp_path / "conf", 1.0)
    status, out, err = _run_spun_through_the_first_job(
        ["run", "--config-dir", str(conf), *REAL_RUN, f"results_dir={tmp_path / 'cur'}"], tmp_path)
    assert status == 0, err
    folders = [str(base), str(results_folder(out))]
    job = compare_runs(load_run(folders[0]), load_run(folders[1])).jobs[0]
    assert job.wall_verdict == SLOWER and job.verdict == HOST_BUSIER, job
    assert job.current_host_other_cores - job.baseline_host_other_cores >= 0.5 * (os.cpu_count() or 1)
    assert compare_main(*folders, DEFAULT_THRESHOLD, False, None) == EXIT_OK
