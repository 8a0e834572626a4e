"""`pipebench attach -- torchrun ...` when a rank fails or Ctrl-C arrives: the measured window is kept and
nothing outlives attach. Each asserts on exit statuses, files and processes, not on a rate, so it runs
beside other tests (test_attach_ranks.py measures, alone)."""

import os
import signal
import sys
import time
import uuid

import pytest
from attach_ranks_kit import (AFTER_WINDOW, RUN_TIMEOUT_S, STEPS, assert_rank_rows, attach_two_ranks, merged_result,
                              no_orphans)


@pytest.mark.slow
def test_a_rank_that_fails_fails_attach_and_what_was_measured_is_kept(torchrun_project):
    mark = uuid.uuid4().hex
    proc = attach_two_ranks(torchrun_project, [sys.executable, "-m", "torch.distributed.run"],
                            steps=10 * AFTER_WINDOW, fail_at=AFTER_WINDOW, mark=mark)
    out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    assert proc.returncode != 0
    result = merged_result(torchrun_project)
    assert_rank_rows(result)
    statuses = result["distributed"]["exit_status"]
    assert statuses["1"] == 3 and statuses["0"] != 0  # its peer lost it at the all-reduce, or was stopped
    assert all(r["steps"] == STEPS for r in result["ranks"])
    assert no_orphans(mark)


@pytest.mark.slow
def test_ctrl_c_reaches_the_ranks_whose_windows_are_written_and_nothing_outlives_attach(torchrun_project):
    mark = uuid.uuid4().hex
    proc = attach_two_ranks(torchrun_project, ["torchrun"], steps=100 * AFTER_WINDOW, mark_at=AFTER_WINDOW, mark=mark)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while not (torchrun_project / "window-over").exists():
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
    result = merged_result(torchrun_project)
    assert_rank_rows(result)
    # The ranks' scripts got it as they would without attach (a peer may see the other's exit first).
    assert 130 in result["distributed"]["exit_status"].values() and "KeyboardInterrupt" in err
    assert no_orphans(mark)
