"""`pipebench ab` on real git repositories made in tmp: a user transform whose CPU cost (or sleep)
is set in a commit, so the truth is known; and `git bisect run` with ab as its test."""

import os
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest
from conftest import PIPEBENCH_SCRIPT, TINY_DATASET

from pipebench.base.errors import ConfigError
from pipebench.base.significance import MIN_SAMPLES
from pipebench.cli.main import main
from pipebench.regress.ab import EXIT_REGRESSION
from pipebench.regress.history import load_history

PIPEBENCH = str(PIPEBENCH_SCRIPT)
# Tiny jobs: one process start dominates; 4 rounds a side is the fewest the rule calls a change on.
JOB = [*TINY_DATASET, "consumer=none", "workers=0", "loader.batch_size=8", "run.steps=6",
       "run.warmup_steps=1", "run.min_time_s=0", "run.repeats=1", "run.profile_steps=0", "trace=none",
       "run.progress=false"]
ROUNDS = ["--rounds", "4"]
# Whole A/B sessions take minutes here (one session: a `pipebench run` a side, paced, 1.2 min under
# load; bisect: about 4 sessions), more than the rest of the suite can afford; PIPEBENCH_AB_SESSIONS=1 runs them.
# The rule they exercise is tested on synthetic series in tests/test_regress_signals.py.
A_B_SESSIONS = pytest.mark.skipif(os.environ.get("PIPEBENCH_AB_SESSIONS") != "1",
                                  reason="whole A/B sessions take minutes: PIPEBENCH_AB_SESSIONS=1 runs them")
USER_TRANSFORM = '''import time

SPIN_MS = {spin}
SLEEP_MS = {sleep}
# The waiting chain's own CPU cost, the same in every commit.
WAIT_SPIN_MS = 2.0


def spin(ms):
    deadline = time.thread_time_ns() + int(ms * 1e6)
    while time.thread_time_ns() < deadline:
        pass


class Cost:
    """Burns SPIN_MS of this thread's CPU time: a chain whose cost a commit sets."""

    def __call__(self, sample):
        spin(SPIN_MS)
        return sample


class Wait:
    """Burns WAIT_SPIN_MS, then sleeps SLEEP_MS: what a busy host's wait looks like to a chain."""

    def __call__(self, sample):
        spin(WAIT_SPIN_MS)
        if SLEEP_MS:
            time.sleep(SLEEP_MS / 1000)
        return sample
'''
CHAIN = "per_sample:\n  - _target_: ab_user.Cost\nper_batch: []\n"
WAIT_CHAIN = "per_sample:\n  - _target_: ab_user.Wait\nper_batch: []\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit(repo: Path, spin: float, sleep: float = 0.0, message: str = "") -> str:
    (repo / "ab_user.py").write_text(USER_TRANSFORM.format(spin=spin, sleep=sleep) + f"# {message}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message or f"spin {spin} sleep {sleep}")
    return git(repo, "rev-parse", "HEAD")


def make_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "user_repo"
    (repo / "conf" / "transform").mkdir(parents=True)
    (repo / "conf" / "transform" / "ab_chain.yaml").write_text(CHAIN)
    (repo / "conf" / "transform" / "ab_wait.yaml").write_text(WAIT_CHAIN)
    (repo / ".gitignore").write_text("results/\n")
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    return repo


def env() -> Dict[str, str]:
    return dict(os.environ)


def ab_args(tmp_path: Path, *refs: str, extra: List[str] = (), sweep: List[str] = ("transform=ab_chain",)) -> List[str]:
    """`pipebench ab ...`'s arguments, without the command."""
    return ["ab", "--config-dir", "conf", *ROUNDS, "--results-dir", str(tmp_path / "results"), *extra, *refs, *JOB,
            *sweep]


def ab(repo: Path, tmp_path: Path, *refs: str, extra: List[str] = (), sweep: List[str] = ("transform=ab_chain",)
       ) -> subprocess.CompletedProcess:
    return subprocess.run([PIPEBENCH, *ab_args(tmp_path, *refs, extra=extra, sweep=sweep)], cwd=repo,
                          capture_output=True, text=True, env=env(), timeout=600)


def verdict_row(stdout: str, job: str = "") -> str:
    return next(line for line in stdout.splitlines() if line.startswith("| `") and job in line)


@A_B_SESSIONS
def test_costlier_commit_is_slower_on_cpu_and_a_sleep_is_wall_only(tmp_path):
    """One session, two jobs: the head commit makes one chain 50% costlier in CPU and only adds a
    sleep to the other (same CPU cost). The first is a regression; the second is `wall only`."""
    repo = make_repo(tmp_path)
    commit(repo, 2.0)
    commit(repo, 3.0, sleep=1.5)
    history = tmp_path / "history" / "this-machine" / "history.csv"
    proc = ab(repo, tmp_path, "HEAD~1", extra=["--history", str(history)], sweep=["transform=ab_chain,ab_wait"])
    assert proc.returncode == EXIT_REGRESSION, proc.stdout + proc.stderr
    assert "| slower | cpu" in verdict_row(proc.stdout, "ab_chain"), proc.stdout
    assert "| wall only | wall |" in verdict_row(proc.stdout, "ab_wait"), proc.stdout
    recorded = {row.job: row for row in load_history(history).rows}
    assert len(recorded) == 2, recorded
    costlier = next(row for job, row in recorded.items() if "ab_chain" in job)
    assert costlier.commit == git(repo, "rev-parse", "HEAD") and costlier.verdict == "slower"
    assert costlier.machine == "this-machine" and costlier.rounds == 4


@pytest.mark.parametrize("case", ["bad_ref", "dirty"])
def test_bad_ref_or_dirty_tree_is_one_line_exit_2(tmp_path, capsys, monkeypatch, case):
    """In-process (a CLI start costs ~8 s): both are refused before a side is checked out or measured;
    the real console script's one-line exit 2 is tested in test_config.py."""
    repo = make_repo(tmp_path)
    commit(repo, 1.0)
    extra = []
    if case == "dirty":
        (repo / "ab_user.py").write_text("# changed\n")
        extra = ["--require-clean"]
    monkeypatch.chdir(repo)
    assert main(ab_args(tmp_path, "no-such-ref" if case == "bad_ref" else "HEAD", extra=extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pipebench: error:")
    assert ("no-such-ref" if case == "bad_ref" else "uncommitted") in err[0]


@A_B_SESSIONS
def test_git_bisect_run_finds_the_planted_commit(tmp_path):
    """Ten commits; the sixth makes the chain 60% costlier. `git bisect run pipebench ab GOOD` finds it."""
    repo = make_repo(tmp_path)
    commits = [commit(repo, 2.0 if i < 5 else 3.2, message=f"commit {i}") for i in range(10)]
    good, planted = commits[0], commits[5]
    git(repo, "bisect", "start", commits[-1], good)
    proc = subprocess.run(["git", "bisect", "run", PIPEBENCH, "ab", "--config-dir", "conf", *ROUNDS,
                           "--results-dir", str(tmp_path / "results"), good, *JOB, "transform=ab_chain"], cwd=repo,
                          capture_output=True,
                          text=True, env=env(), timeout=900)
    assert f"{planted} is the first bad commit" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_version_note_names_what_moved_and_side_env_keeps_the_other_tree_out(tmp_path):
    from pipebench.regress.ab import side_env, version_note

    assert version_note({"pillow": "10.4.0", "torch": "2.4"}, {"pillow": "11.0.0", "torch": "2.4"}) == \
        "versions differ between the sides: pillow 10.4.0 -> 11.0.0"
    assert version_note({"torch": "2.4"}, {"torch": "2.4"}) is None
    base, head = tmp_path / "base", tmp_path / "head"
    env = side_env(base, [head], {"PYTHONPATH": f"{head}{os.pathsep}/opt/lib"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(base), "/opt/lib"]


def test_ab_defaults_to_rounds_it_accepts_and_refuses_one_asked_for():
    """run's default of 1 round would be refused (a session pairs rounds): ab uses its own 5 and the
    header says so; rounds the user or the suite asks for are kept, and 1 asked for is refused."""
    from pipebench.cli.ab import AB_DEFAULT_ROUNDS, DEFAULT_ROUNDS_NOTE, _rounds

    assert _rounds(None, ["transform=yuv_mask", "workers=0,2"], None) == (AB_DEFAULT_ROUNDS, DEFAULT_ROUNDS_NOTE)
    assert AB_DEFAULT_ROUNDS >= MIN_SAMPLES and "--rounds N" in DEFAULT_ROUNDS_NOTE
    assert _rounds(None, ["suite=nightly"], None) == (5, "")
    assert _rounds(None, ["rounds=3"], None) == (3, "") and _rounds(6, [], None) == (6, "")
    with pytest.raises(ConfigError, match="rounds=1: an A/B session pairs rounds"):
        _rounds(None, ["rounds=1"], None)
