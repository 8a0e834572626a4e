"""torchrun's launcher in a fork of the job: its log, exit status and session are a fresh torchrun's."""

import os
import signal

import psutil
import pytest

from pipebench.measure.distributed.multirank import root_cause
from pipebench.measure.distributed.torchrun_fork import fork_torchrun

# One rank on localhost, nothing restarted: what a job's launch asks, with another rank command.
ONE_RANK = ["--standalone", "--nproc_per_node=1", "--max_restarts=0"]


def _launch(tmp_path, args):
    log = tmp_path / "ranks.log"
    with log.open("xb") as out:  # torchrun's own files in the test's folder, as a job's go in its private one
        launcher = fork_torchrun([f"--log_dir={tmp_path}", *args], dict(os.environ), out.fileno())
    return launcher, log


def test_a_rank_that_fails_gives_status_1_and_torchruns_root_cause_in_the_log(tmp_path):
    launcher, log = _launch(tmp_path, [*ONE_RANK, "-m", "pipebench_no_such_module"])
    assert launcher.wait(timeout=60) == 1
    text = log.read_text()
    assert "No module named pipebench_no_such_module" in text
    assert root_cause(text) == (0, 1)


def test_a_bad_argument_is_torchruns_usage_error_and_status_2(tmp_path):
    launcher, log = _launch(tmp_path, ["--no-such-flag", "-m", "json"])
    assert launcher.wait(timeout=60) == 2
    assert "unrecognized arguments: --no-such-flag" in log.read_text()


def test_the_launcher_leads_its_own_group_and_times_out(tmp_path):
    launcher, _ = _launch(tmp_path, [*ONE_RANK, "--no-python", "sleep", "30"])
    with pytest.raises(psutil.TimeoutExpired):
        launcher.wait(timeout=0.5)
    assert os.getpgid(launcher.pid) == launcher.pid != os.getpgid(0)
    os.killpg(launcher.pid, signal.SIGTERM)  # as the job's timeout does: torchrun stops its rank first
    status = launcher.wait(timeout=30)
    assert status != 0
    assert launcher.wait() == status  # reaped once, answered again
