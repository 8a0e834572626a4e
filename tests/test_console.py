"""What a user reads in the terminal: pipebench's own lines, not torch's C++ logs and warnings."""

import dataclasses
import os
import re
import warnings

import pytest
from conftest import FAST_JOB, NO_CHAIN, NO_PROFILE, TINY_DATASET, compose_spec, run_cli

from pipebench.base.cores import usable_cores
from pipebench.measure.setup import oversubscription_note, quiet_torch_output

# What torch prints on its own on a machine without a GPU: kineto's C++ log lines at the
# profiler's start and stop (workers=0 profiles), and DataLoader's worker-count UserWarning.
TORCH_NOISE = ("USDT:", "profiler_start", "profiler_stop", "gpuGetDeviceCount", "This DataLoader will create",
               "UserWarning", "check_worker_number_rationality")
NOTE = re.compile(r"^note: (\d+) workers on (\d+) usable cores?: workers beyond the cores time-slice$", re.M)
# The shortest jobs with the profiler pass kept: kineto's lines come from the workers=0 job's profile.
PROFILED_FAST_JOB = [word for word in FAST_JOB if word not in NO_PROFILE]


@pytest.mark.slow
def test_a_tiny_run_prints_one_note_for_too_many_workers_and_none_of_torchs_lines(tmp_path):
    """workers=0 runs the torch profiler; one worker more than the cores makes torch warn."""
    cores = usable_cores()
    proc = run_cli(["run", *PROFILED_FAST_JOB, *NO_CHAIN, f"workers=0,{cores + 1}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    output = proc.stdout + proc.stderr
    assert [noise for noise in TORCH_NOISE if noise in output] == [], proc.stderr
    assert NOTE.findall(output) == [(str(cores + 1), str(cores))]
    # The note comes with its job, right after the job's start line.
    lines = proc.stdout.splitlines()
    assert lines[lines.index(NOTE.search(output).group(0)) - 1].startswith("[job 2/2]")


def test_the_note_names_workers_and_cores_only_when_workers_outnumber_them():
    spec = compose_spec([*TINY_DATASET, "workers=4"])
    assert oversubscription_note(spec, 4) is None
    assert oversubscription_note(spec, 1) == "note: 4 workers on 1 usable core: workers beyond the cores time-slice"
    assert oversubscription_note(spec, 2).startswith("note: 4 workers on 2 usable cores:")


def test_a_multi_rank_job_leaves_the_note_to_its_own_warning():
    spec = compose_spec([*TINY_DATASET, "workers=4"])
    ranks = dataclasses.replace(spec, distributed=dataclasses.replace(spec.distributed, nproc=2))
    assert oversubscription_note(ranks, 2) is None


def test_quieting_keeps_a_kineto_level_the_user_set(monkeypatch):
    monkeypatch.setenv("KINETO_LOG_LEVEL", "0")
    with warnings.catch_warnings():
        quiet_torch_output()
    assert os.environ["KINETO_LOG_LEVEL"] == "0"


def test_quieting_drops_torchs_profiler_cycle_warning_and_nothing_else():
    """torch 2.11 printed it at every job's first profiled step on the H100 host."""
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        quiet_torch_output()
        warnings.warn("Warning: Profiler clears events at the end of each cycle.Only events from the current "
                      "cycle will be reported.To keep events across cycles, set acc_events=True.", UserWarning)
        warnings.warn("a warning of the user's own", UserWarning)
    assert [str(w.message) for w in shown] == ["a warning of the user's own"]
