"""How reliably `pipebench attach` ends on a signal to its process group at workers=2 (issue 55): each
trial runs the real command on an endless script with two persistent DataLoader workers, waits until
the window holds measured steps, sends SIGTERM or SIGINT to the whole group (what a scheduler or a
terminal's Ctrl-C sends), and reads how it ended:

- `hung`: attach had not exited `--hang-s` after the signal (it is then sent SIGINT again, which dumps
  every thread's stack to its stderr, kept under --keep; then SIGKILL);
- `clean`: the right exit status (143, 130), the results written, and stderr holding only attach's own
  lines (SIGTERM: one line; SIGINT: the script's KeyboardInterrupt traceback), no "Exception ignored";
- `exit s`: the median seconds from the signal to attach's exit.

`--short-epochs` runs the loader in epochs of 4 batches with workers that are not persistent, so
torch's shutdown of an epoch's workers (its iterator's `__del__`) is running at many of the signals:
the case where a signal raised inside `__del__` was printed and swallowed.

It prints one table and exits 1 unless every trial was clean. A trial takes 5-20 s on the 2-core
machine (torch's import and two workers), so a few trials is a check, 35 a measurement:

    python benchmarks/attach_signals.py --trials 3
    flock /tmp/pipebench-measure.lock python benchmarks/attach_signals.py --trials 35 --keep /tmp/attach-signals
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fault_kit import sigint_at_default  # noqa: E402
from test_attach_ends import ENDLESS, START_DEADLINE_S  # noqa: E402

from pipebench.base.tables import markdown_table  # noqa: E402

DEFAULT_TRIALS = 5
# The endless script with short epochs and workers started again each epoch.
SHORT_EPOCHS = (ENDLESS.replace("return 100000", "return 16")
                .replace("persistent_workers=True", "persistent_workers=False")
                .replace("for n, x in enumerate(loader):", "for n, x in enumerate(x for _ in iter(int, 1) for x in loader):"))
# How long attach may take from the signal to its exit before the trial counts as a hang: writing
# the results and report.md takes a few seconds on the loaded 2-core machine.
DEFAULT_HANG_S = 60.0
# After the second signal (the stack dump), how long before SIGKILL.
DUMP_GRACE_S = 5.0
SIGNALS = {"SIGTERM": (signal.SIGTERM, 143), "SIGINT": (signal.SIGINT, 130)}
# What attach's own stderr may hold after each signal (anything else is a stray line).
OWN_LINES = ("pipebench attach:", "Traceback (most recent call last):", "  ", "KeyboardInterrupt")


def _trial(name: str, folder: Path, hang_s: float, source: str) -> Dict[str, object]:
    signum, status = SIGNALS[name]
    script, marker, out = folder / "endless.py", folder / "ready", folder / "out"
    script.write_text(source)
    err_path = folder / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "pipebench.cli.main", "attach", "--steps", "100000",
                                 "--skip-steps", "2", "--seconds", "600", "--out", str(out), "--", str(script),
                                 str(marker)], cwd=folder, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True, preexec_fn=sigint_at_default)
        deadline = time.monotonic() + START_DEADLINE_S
        while not marker.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                return {"started": False}
            time.sleep(0.05)
        os.killpg(proc.pid, signum)
        sent = time.monotonic()
        hung = False
        try:
            proc.wait(timeout=hang_s)
        except subprocess.TimeoutExpired:
            hung = True
            os.kill(proc.pid, signal.SIGINT)  # the second signal: attach dumps its threads' stacks
            try:
                proc.wait(timeout=DUMP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.monotonic() - sent
    lines = err_path.read_text().splitlines()
    stray = [line for line in lines if line.strip() and not line.startswith(OWN_LINES)]
    written = (out / "job-0" / "result.json").exists()
    clean = (not hung and proc.returncode == status and written and not stray
             and not any("Exception ignored" in line for line in lines))
    return {"started": True, "hung": hung, "clean": clean, "seconds": seconds, "stray": stray[:3],
            "status": proc.returncode, "written": written}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help="trials of each signal")
    parser.add_argument("--signal", choices=sorted(SIGNALS), action="append", help="only this signal (repeatable)")
    parser.add_argument("--hang-s", type=float, default=DEFAULT_HANG_S, help="seconds before a trial is a hang")
    parser.add_argument("--keep", help="keep each trial's folder (its stderr.txt) under this folder")
    parser.add_argument("--short-epochs", action="store_true",
                        help="epochs of 4 batches, workers started again each epoch (see above)")
    args = parser.parse_args(argv)
    source = SHORT_EPOCHS if args.short_epochs else ENDLESS
    names = args.signal or sorted(SIGNALS)
    outcomes: Dict[str, List[Dict[str, object]]] = {name: [] for name in names}
    for trial in range(args.trials):
        for name in names:  # interleaved, so drift on a shared machine hits both alike
            base = Path(args.keep) if args.keep else None
            if base is not None:
                folder = base / f"{name}-{trial}"
                folder.mkdir(parents=True, exist_ok=True)
                outcome = _trial(name, folder, args.hang_s, source)
            else:
                with tempfile.TemporaryDirectory(prefix="attach-signals-") as tmp:
                    outcome = _trial(name, Path(tmp), args.hang_s, source)
            outcomes[name].append(outcome)
            if outcome.get("started") and not outcome["clean"]:
                print(f"  {name} trial {trial}: status {outcome['status']}, hung {outcome['hung']}, written "
                      f"{outcome['written']}, stray {outcome['stray']}", file=sys.stderr)
    rows = []
    for name, done in outcomes.items():
        started = [o for o in done if o.get("started")]
        rows.append({"signal": name, "trials": len(done), "started": len(started),
                     "clean": sum(bool(o["clean"]) for o in started), "hung": sum(bool(o["hung"]) for o in started),
                     "exit s": f"{statistics.median(o['seconds'] for o in started):.1f}" if started else ""})
    print(markdown_table(rows, ["signal", "trials", "started", "clean", "hung", "exit s"]))
    return 0 if all(r["clean"] == r["trials"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
