"""`pipebench attach -- torchrun ...`: every rank watched, a row a rank and the straggler figures.

Two gloo ranks on the CPU run a small training script: a DistributedSampler loader over a dataset
that sleeps FETCH_MS a sample (rank 1: EXTRA_MS more), a step that sleeps STEP_MS and ends in an
all-reduce. Rank 1's loader makes both ranks wait: its own wait is longer by BATCH * EXTRA_MS a
step, and rank 0 waits as long at the all-reduce. Sleeps, not busy-waits, so the two ranks and
the rest of this 2-core machine do not time-slice each other's costs.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest
from conftest import PIPEBENCH_SCRIPT
from fault_kit import RUN_MARK_ENV, marked_processes, sigint_at_default

from pipebench.attach.watched_ranks import RANKS_FOLDER, collective_estimates
from pipebench.base.descendants import no_descendant_outlives
from pipebench.base.errors import ConfigError
from pipebench.cli.attach_torchrun import RANK_MODULE, parse_torchrun, torchrun_args
from pipebench.record.results import scan_job_results

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

FETCH_MS = 0.5
EXTRA_MS = 2.0
STEP_MS = 5.0
BATCH = 4
STEPS = 30
SKIP = 3
# Rank 1's extra wait a step, and rank 0's extra wait at the all-reduce.
STRAGGLE_MS = BATCH * EXTRA_MS
# torchrun, two ranks importing torch and pipebench, a few hundred ms of steps: well under this.
RUN_TIMEOUT_S = 180
# Every process attach started is gone this long after it ends (the fault work's target).
ORPHAN_DEADLINE_S = 2.0

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    FETCH_MS, EXTRA_MS, STEP_MS = (float(a) for a in sys.argv[1:4])
    STEPS, FAIL_AT, MARK_AT = (int(a) for a in sys.argv[4:7])
    RANK = int(os.environ["RANK"])

    class SlowSamples(Dataset):
        def __len__(self):
            return 100_000

        def __getitem__(self, i):
            time.sleep((FETCH_MS + (EXTRA_MS if RANK == 1 else 0.0)) / 1000)
            return torch.zeros(4), i

    def main():
        dist.init_process_group("gloo")
        dataset = SlowSamples()
        loader = DataLoader(dataset, batch_size={batch}, sampler=DistributedSampler(dataset, shuffle=False))
        grad = torch.zeros(16)
        for n, (x, y) in enumerate(loader):
            time.sleep(STEP_MS / 1000)
            dist.all_reduce(grad)
            if RANK == 1 and n == FAIL_AT:
                sys.exit(3)
            if RANK == 0 and n == MARK_AT:
                Path("window-over").touch()
            if n == STEPS:
                break
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
""").format(batch=BATCH)
# Past the measured window: the warm-up, the window and the first batch.
AFTER_WINDOW = SKIP + STEPS + 3


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "ranktrain.py").write_text(SCRIPT)
    return tmp_path


def _attach(project: Path, launcher, steps: int, fail_at: int = -1, mark_at: int = -1, mark: str = "") -> subprocess.Popen:
    """`pipebench attach` over two ranks, in a session of its own, every process it starts marked."""
    script = ["-m", "ranktrain"] if launcher[-1] != "torchrun" else ["ranktrain.py"]
    command = [str(PIPEBENCH_SCRIPT), "attach", "--steps", str(STEPS), "--skip-steps", str(SKIP), "--out", "out", "--",
               *launcher, "--standalone", "--nproc-per-node", "2", *script,
               str(FETCH_MS), str(EXTRA_MS), str(STEP_MS), str(steps), str(fail_at), str(mark_at)]
    return subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=sigint_at_default,
                            env={**os.environ, RUN_MARK_ENV: mark or uuid.uuid4().hex})


def _no_orphans(mark: str) -> bool:
    deadline = time.monotonic() + ORPHAN_DEADLINE_S
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not marked_processes(mark)


def _merged(project: Path):
    scan = scan_job_results(project / "out")  # read back as report/compare read it: the checks pass
    assert not scan.damaged and len(scan.results) == 1
    return json.loads((project / "out" / "job-0" / "result.json").read_text())


def _assert_rank_rows(result) -> None:
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    summary = result["summary"]
    assert summary["ranks"] == 2 and summary["straggler_ratio"] >= 1.0
    assert summary["samples_per_s"] == pytest.approx(sum(r["samples_per_s"] for r in result["ranks"]))
    assert summary["starvation_pct_max"] == max(r["starvation_pct"] for r in result["ranks"])
    assert set(result["rank_passes"]) == {"0", "1"}


@pytest.mark.slow
def test_torchrun_under_attach_gives_a_row_a_rank_and_the_straggler_figures(project):
    mark = uuid.uuid4().hex
    proc = _attach(project, ["torchrun"], steps=AFTER_WINDOW + 2, mark=mark)
    out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, err
    result = _merged(project)
    _assert_rank_rows(result)
    assert result["distributed"]["exit_status"] == {"0": 0, "1": 0}
    assert (project / "out" / RANKS_FOLDER / "rank-1" / "job-0" / "result.json").is_file()
    # Both ranks' samples pooled: the load row (each sample's __getitem__) under its own name.
    rows = {r["transform"]: r for r in result["transforms"]}
    assert list(rows) == ["SlowSamples", "default_collate"]
    assert rows["SlowSamples"]["stage"] == "load" and rows["SlowSamples"]["calls"] == 2 * STEPS * BATCH
    assert rows["SlowSamples"]["ms_per_call_median"] >= FETCH_MS
    fast, slow = result["ranks"]
    # The slow rank's extra wait shows as its busy time and as its peer's wait at the all-reduce.
    assert slow["busy_ms_mean"] - fast["busy_ms_mean"] > 0.5 * STRAGGLE_MS
    assert fast["collective_ms_mean"] - slow["collective_ms_mean"] > 0.5 * STRAGGLE_MS
    assert result["summary"]["straggler_ratio"] > 1.15
    assert slow["starvation_pct"] > fast["starvation_pct"] + 20
    assert f"straggler ratio {result['summary']['straggler_ratio']:.3f}" in out
    assert out.strip().splitlines()[-1].startswith("results: out")
    assert _no_orphans(mark)


@pytest.mark.beside
@pytest.mark.slow
def test_a_rank_that_fails_fails_attach_and_what_was_measured_is_kept(project):
    mark = uuid.uuid4().hex
    proc = _attach(project, [sys.executable, "-m", "torch.distributed.run"], steps=10 * AFTER_WINDOW,
                   fail_at=AFTER_WINDOW, mark=mark)
    out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    assert proc.returncode != 0
    result = _merged(project)
    _assert_rank_rows(result)
    statuses = result["distributed"]["exit_status"]
    assert statuses["1"] == 3 and statuses["0"] != 0  # its peer lost it at the all-reduce, or was stopped
    assert all(r["steps"] == STEPS for r in result["ranks"])
    assert _no_orphans(mark)


@pytest.mark.beside
@pytest.mark.slow
def test_ctrl_c_reaches_the_ranks_whose_windows_are_written_and_nothing_outlives_attach(project):
    mark = uuid.uuid4().hex
    proc = _attach(project, ["torchrun"], steps=100 * AFTER_WINDOW, mark_at=AFTER_WINDOW, mark=mark)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while not (project / "window-over").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"attach ended (status {proc.poll()}) or timed out before rank 0's window was over")
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # attach alone, as a terminal's Ctrl-C reaches attach's group
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    result = _merged(project)
    _assert_rank_rows(result)
    # The ranks' scripts got it as they would without attach (a peer may see the other's exit first).
    assert 130 in result["distributed"]["exit_status"].values() and "KeyboardInterrupt" in err
    assert _no_orphans(mark)


def test_the_command_is_rewritten_with_torchruns_options_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text("")
    assert torchrun_args(["--", "python", "train.py"]) is None
    words = torchrun_args(["--", "torchrun", "--standalone", "--nproc-per-node", "2", "train.py", "--lr", "1", "-m", "x"])
    assert words == torchrun_args(["python3", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                   "train.py", "--lr", "1", "-m", "x"])
    command = parse_torchrun(words)
    assert command.rank_command() == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                      "2", "-m", RANK_MODULE, "train.py", "--lr", "1", "-m", "x"]
    module = parse_torchrun(["--nproc-per-node=2", "-m", "mypkg.train", "--epochs", "1"])
    assert module.rank_command()[-6:] == ["-m", RANK_MODULE, "-m", "mypkg.train", "--epochs", "1"]
    for bad, says in ((["--no-python", "train.py"], "--no-python"), (["missing.py"], "no script at missing.py"),
                      (["--nproc-per-node"], "torchrun")):
        with pytest.raises(ConfigError, match=says):
            parse_torchrun(bad)


def _pass(step_ms, wait_ms):
    return {"step_ms": step_ms, "wait_ms": wait_ms}


def test_the_collective_wait_is_what_a_rank_spends_after_its_batch_beyond_the_fastest_rank():
    # Step k: rank 0 waits 2 ms for data, rank 1 8 ms; the step's own work is 5 ms, so rank 0
    # waits 6 ms at the all-reduce. Rank 1's second pass is longer: only the common steps count.
    rank0 = {"passes": [_pass([13.0, 13.0], [2.0, 2.0])]}
    rank1 = {"passes": [_pass([13.0, 13.0, 40.0], [8.0, 8.0, 1.0]), _pass([1.0], [0.5])]}
    fast, slow = collective_estimates([rank0, rank1])
    assert fast == {"busy_ms_mean": 7.0, "collective_ms_mean": 6.0, "collective_ms_p99": 6.0}
    assert slow == {"busy_ms_mean": 13.0, "collective_ms_mean": 0.0, "collective_ms_p99": 0.0}
    # On the GPU's clock, the wait the GPU felt stands for the host's.
    gpu = {"passes": [{**_pass([13.0, 13.0], [9.0, 9.0]), "gpu_idle_data_ms": [2.0, 2.0]}]}
    assert collective_estimates([gpu, rank1])[0]["collective_ms_mean"] == 6.0


def test_an_orphan_in_a_session_of_its_own_is_adopted_and_ended_on_the_way_out():
    # As torchrun's ranks are: started in a new session by a parent that then exits.
    with no_descendant_outlives():
        parent = subprocess.run(["sh", "-c", "setsid sleep 60 > /dev/null 2>&1 & echo $!"], capture_output=True, text=True)
        orphan = psutil.Process(int(parent.stdout))
        assert orphan.ppid() == os.getpid()  # adopted here, not by init
    assert not orphan.is_running()
