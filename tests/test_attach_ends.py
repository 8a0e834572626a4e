"""How `pipebench attach` ends: Ctrl-C, SIGTERM, a killed attach, and a script with a loader of its own.

The signal tests run the real command as its own session (start_new_session=True), wait for the
script's marker file (written after some steps, so the window holds measured steps), send the
signal, and then look for any process left in the session: DataLoader workers included.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from fault_kit import sigint_at_default

import pipebench
from pipebench.cli.main import main
from pipebench.record.results import read_result

REPO = Path(__file__).resolve().parents[1]
# The script writes its marker after this many steps; the window has measured steps by then.
MARKER_STEP = 25
# Starting torch and two workers on a loaded 2-core machine takes seconds; the marker's deadline.
START_DEADLINE_S = 90.0
# After attach exits, its session must be empty at once; a short grace for the kernel to reap.
REAP_GRACE_S = 1.0
# A killed attach's workers die with it (PR_SET_PDEATHSIG): well before torch's own check of its
# parent, every MP_STATUS_CHECK_INTERVAL (5 s).
ORPHAN_GRACE_S = 2.5

ENDLESS = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Spin(Dataset):
        def __len__(self):
            return 100000
        def __getitem__(self, i):
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass
            return torch.zeros(3)

    loader = DataLoader(Spin(), batch_size=4, num_workers=2, persistent_workers=True)
    for n, x in enumerate(loader):
        time.sleep(0.002)
        if n == {marker}:
            Path(sys.argv[1]).write_text("ready")
""").format(marker=MARKER_STEP)


def _session(sid: int):
    """Processes of the session `sid` still alive (zombies left for the kernel to reap excluded)."""
    left = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getsid(proc.pid) == sid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return left


def _empty_within(sid: int, seconds: float) -> list:
    deadline = time.monotonic() + seconds
    while _session(sid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _session(sid)


def _start(tmp_path):
    script, marker, out = tmp_path / "endless.py", tmp_path / "ready", tmp_path / "out"
    script.write_text(ENDLESS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "pipebench.cli.main", "attach", "--steps", "100000",
                             "--skip-steps", "2", "--seconds", "600", "--out", str(out), "--", str(script), str(marker)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=sigint_at_default)
    deadline = time.monotonic() + START_DEADLINE_S
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the script never reached step {MARKER_STEP}: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    workers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert len(workers) >= 2  # the loader's workers are running: what must not outlive attach
    return proc, out


TERMINATED = "terminated (SIGTERM); what was measured is kept"


@pytest.mark.slow
@pytest.mark.parametrize("signum, group, status, said", [
    # Ctrl-C reaches the terminal's whole foreground group; SIGTERM, as a scheduler sends it, attach
    # alone or its whole group (the workers then die with the script, not after it).
    (signal.SIGINT, True, 130, "KeyboardInterrupt"),
    (signal.SIGTERM, False, 143, TERMINATED),
    (signal.SIGTERM, True, 143, TERMINATED),
], ids=["SIGINT to the group", "SIGTERM to attach", "SIGTERM to the group"])
def test_a_signal_ends_the_script_keeps_the_window_and_leaves_no_process(tmp_path, signum, group, status, said):
    proc, out = _start(tmp_path)
    (os.killpg if group else os.kill)(proc.pid, signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert said in err
    if signum == signal.SIGTERM:  # one line, no "DataLoader worker is killed by signal" from the dying workers
        assert err.strip().splitlines() == [f"pipebench attach: {tmp_path / 'endless.py'} {said}"]
    summary = read_result(out / "job-0" / "result.json")["summary"]
    assert summary["steps"] >= MARKER_STEP - 2 - 1  # the steps measured up to the marker, at least
    assert _empty_within(proc.pid, REAP_GRACE_S) == []


@pytest.mark.slow
def test_a_killed_attach_takes_its_workers_with_it(tmp_path):
    proc, _ = _start(tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert _empty_within(proc.pid, ORPHAN_GRACE_S) == []


OWN_LOADER = textwrap.dedent("""
    import sys, time

    class BatchPipeline:
        def __init__(self, batches):
            self.batches = batches
        def __iter__(self):
            for n in range(self.batches):
                yield [n] * 4

    def train():
        for batch in BatchPipeline(10):
            pass

    if sys.argv[1] == "global":
        pipe = BatchPipeline(10)
        for batch in pipe:
            pass
    else:
        train()
    sys.exit(int(sys.argv[2]))
""")
CLASS_LINE = next(n for n, line in enumerate(OWN_LOADER.splitlines(), 1) if line.startswith("class BatchPipeline"))


@pytest.mark.parametrize("where, seen", [
    ("global", f"BatchPipeline object `pipe` (class at train.py:{CLASS_LINE})"),
    # Only a function that returned held the object: its class, which the script defines, is seen.
    ("local", f"class BatchPipeline (train.py:{CLASS_LINE})"),
])
def test_a_loader_of_its_own_is_named_in_one_line_with_the_way_in(tmp_path, capsys, where, seen):
    script = tmp_path / "train.py"
    script.write_text(OWN_LOADER)
    assert main(["attach", "--out", str(tmp_path / "out"), "--", str(script), where, "4"]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert seen in err[0] and "failed (it exited 4)" in err[0] and "pipebench.watch(loader)" in err[0]
    assert not (tmp_path / "out").exists()


STEP_S = 0.004
BATCH_S = 0.004


class SlowPipeline:
    """A loader of its own: each batch takes BATCH_S to make (a sleep: its wall time is known)."""

    def __iter__(self):
        for n in range(40):
            time.sleep(BATCH_S)
            yield [n] * 4


def test_pipebench_watch_measures_a_loader_of_its_own():
    watched = pipebench.watch(SlowPipeline(), steps=30, skip_steps=2)
    for _ in watched:
        time.sleep(STEP_S)
    result = watched.result()
    assert result.dataset_class == "SlowPipeline" and result.workers == 0 and result.steps_measured == 30
    # The wait and the step both sleep the same length: half the time is spent waiting.
    assert result.starvation_pct == pytest.approx(50.0, abs=10.0)
    assert result.transforms == []
