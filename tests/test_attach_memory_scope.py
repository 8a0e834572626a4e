"""A watched loader's memory figures count the main process and the loader's own workers, not a
process the script started beside them (wandb's `wandb-core` service was counted as a worker)."""

import os
import subprocess
import sys

from torch.utils.data import DataLoader

import pipebench

STEPS = 6


def test_a_process_the_script_starts_is_not_counted_as_a_worker():
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # Persistent, so the worker outlives the loop: the meters read on a thread of their own, which a
        # loaded host may run after a non-persistent worker has already exited.
        loader = DataLoader(list(range(4 * (STEPS + 4))), batch_size=4, num_workers=1, multiprocessing_context="fork",
                            persistent_workers=True)
        watched = pipebench.watch(loader, steps=STEPS, skip_steps=1)
        for _ in watched:
            pass
        result = watched.result()
    finally:
        stranger.kill()
        stranger.wait()
    meters = result.record.sections["meters"]
    counted = {process["pid"] for process in meters["memory"]["processes"]}
    assert stranger.pid not in counted
    assert f"(pid {stranger.pid})" in meters["scope"]  # named as left out
    # The loader's worker is known from its iterator (its dataset, untimed, sends no Startup) and counted.
    workers = watched.watch.worker_pids
    assert len(workers) == 1 and counted == workers | {os.getpid()}
