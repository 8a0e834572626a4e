"""The attach-over-torchrun tests' training script and helpers, for test_attach_ranks.py (alone) and
test_attach_ranks_faults.py (beside).

Two gloo ranks on the CPU run a small training script: a DistributedSampler loader over a dataset
that sleeps FETCH_MS a sample (rank 1: EXTRA_MS more), a step that sleeps STEP_MS and ends in an
all-reduce. Rank 1's loader makes both ranks wait: its own wait is longer by BATCH * EXTRA_MS a
step, and rank 0 waits as long at the all-reduce. Sleeps, not busy-waits, so the two ranks and
the rest of this 2-core machine do not time-slice each other's costs.
"""

import json
import os
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from conftest import PIPEBENCH_SCRIPT
from fault_kit import RUN_MARK_ENV, marked_processes, sigint_at_default

from pipebench.record.results import scan_job_results

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


def attach_two_ranks(project: Path, launcher, steps: int, fail_at: int = -1, mark_at: int = -1, mark: str = "") -> subprocess.Popen:
    """`pipebench attach` over two ranks, in a session of its own, every process it starts marked."""
    script = ["-m", "ranktrain"] if launcher[-1] != "torchrun" else ["ranktrain.py"]
    command = [str(PIPEBENCH_SCRIPT), "attach", "--steps", str(STEPS), "--skip-steps", str(SKIP), "--out", "out", "--",
               *launcher, "--standalone", "--nproc-per-node", "2", *script,
               str(FETCH_MS), str(EXTRA_MS), str(STEP_MS), str(steps), str(fail_at), str(mark_at)]
    return subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=sigint_at_default,
                            env={**os.environ, RUN_MARK_ENV: mark or uuid.uuid4().hex})


def no_orphans(mark: str) -> bool:
    deadline = time.monotonic() + ORPHAN_DEADLINE_S
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not marked_processes(mark)


def merged_result(project: Path):
    scan = scan_job_results(project / "out")  # read back as report/compare read it: the checks pass
    assert not scan.damaged and len(scan.results) == 1
    return json.loads((project / "out" / "job-0" / "result.json").read_text())


def assert_rank_rows(result) -> None:
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    summary = result["summary"]
    assert summary["ranks"] == 2 and summary["straggler_ratio"] >= 1.0
    assert summary["samples_per_s"] == pytest.approx(sum(r["samples_per_s"] for r in result["ranks"]))
    assert summary["starvation_pct_max"] == max(r["starvation_pct"] for r in result["ranks"])
    assert set(result["rank_passes"]) == {"0", "1"}


def write_rank_script(root: Path) -> Path:
    """`root` with the training script, ranktrain.py."""
    (root / "ranktrain.py").write_text(SCRIPT)
    return root
