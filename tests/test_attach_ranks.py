"""`pipebench attach -- torchrun ...`: every rank watched, a row a rank and the straggler figures, on
attach_ranks_kit's two-rank training script; its faults are in test_attach_ranks_faults.py."""

import os
import subprocess
import uuid
from pathlib import Path

import psutil
import pytest
from attach_ranks_kit import (AFTER_WINDOW, BATCH, FETCH_MS, RUN_TIMEOUT_S, STEPS, STRAGGLE_MS, assert_rank_rows,
                              attach_two_ranks, merged_result, no_orphans)

from pipebench.attach.watched_ranks import RANKS_FOLDER, collective_estimates
from pipebench.base.descendants import no_descendant_outlives
from pipebench.base.errors import ConfigError
from pipebench.cli.attach_torchrun import RANK_MODULE, parse_torchrun, torchrun_args

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone


@pytest.mark.slow
def test_torchrun_under_attach_gives_a_row_a_rank_and_the_straggler_figures(torchrun_project):
    mark = uuid.uuid4().hex
    proc = attach_two_ranks(torchrun_project, ["torchrun"], steps=AFTER_WINDOW + 2, mark=mark)
    out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, err
    result = merged_result(torchrun_project)
    assert_rank_rows(result)
    assert result["distributed"]["exit_status"] == {"0": 0, "1": 0}
    assert (torchrun_project / "out" / RANKS_FOLDER / "rank-1" / "job-0" / "result.json").is_file()
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
    assert no_orphans(mark)


def test_the_command_is_rewritten_with_torchruns_options_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text("")
    assert torchrun_args(["--", "python", "train.py"]) is None
    words = torchrun_args(["--", "torchrun", "--standalone", "--nproc-per-node", "2", "train.py", "--lr", "1", "-m", "x"])
    assert words == torchrun_args(["python3", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                   "train.py", "--lr", "1", "-m", "x"])
    command = parse_torchrun(words)
    assert command.rank_args() == ["--standalone", "--nproc-per-node", "2", "-m", RANK_MODULE, "train.py", "--lr", "1",
                                   "-m", "x"]
    module = parse_torchrun(["--nproc-per-node=2", "-m", "mypkg.train", "--epochs", "1"])
    assert module.rank_args()[-6:] == ["-m", RANK_MODULE, "-m", "mypkg.train", "--epochs", "1"]
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
    fast, slow = collective_estimates([rank0["passes"], rank1["passes"]])
    assert fast == {"busy_ms_mean": 7.0, "collective_ms_mean": 6.0, "collective_ms_p99": 6.0}
    assert slow == {"busy_ms_mean": 13.0, "collective_ms_mean": 0.0, "collective_ms_p99": 0.0}
    # On the GPU's clock, the wait the GPU felt stands for the host's.
    gpu = {"passes": [{**_pass([13.0, 13.0], [9.0, 9.0]), "gpu_idle_data_ms": [2.0, 2.0]}]}
    assert collective_estimates([gpu["passes"], rank1["passes"]])[0]["collective_ms_mean"] == 6.0


def test_an_orphan_in_a_session_of_its_own_is_adopted_and_ended_on_the_way_out():
    # As torchrun's ranks are: started in a new session by a parent that then exits.
    with no_descendant_outlives():
        parent = subprocess.run(["sh", "-c", "setsid sleep 60 > /dev/null 2>&1 & echo $!"], capture_output=True, text=True)
        orphan = psutil.Process(int(parent.stdout))
        assert orphan.ppid() == os.getpid()  # adopted here, not by init
    assert not orphan.is_running()
