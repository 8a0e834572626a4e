"""Where a running job's CPU goes: each process and thread under a command, by role, over a window.

A multi-rank job is torchrun's agent, its ranks and each rank's DataLoader workers; each process has its
main thread and others (the loader's queue feeders, gloo's, pipebench's meters). This starts COMMAND,
waits --delay seconds (past the start-up, into the measured steps), reads every thread's CPU time from
/proc twice, --window seconds apart, and prints the share of one core each (role, thread) group used,
the largest first. Roles: `rank` (a child of torch.distributed.run), `worker` (a child of a rank),
`torchrun`, else the process's command. Linux only. Run the same job under pipebench and as a plain loop
(`benchmarks/plain_ranks_check.py`) to see which threads the harness adds.

    python benchmarks/thread_cpu.py --delay 14 -- pipebench run dataset=storage_samples transform=none \\
        dataset.sample_bytes=100000 dataset.length=40000 consumer.step_ms=50 loader.batch_size=4 \\
        dataset.storage.shared_mb_per_s=30 workers=2 run.steps=400 trace=none distributed.nproc=4
"""

import argparse
import collections
import os
import subprocess
import sys
import time
from typing import Dict, List, Tuple

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TORCHRUN = "torch.distributed.run"
# /proc/<pid>/stat after the command's closing parenthesis: state is field 0, ppid 1, utime 11, stime 12.
PPID_FIELD, UTIME_FIELD, STIME_FIELD = 1, 11, 12

Key = Tuple[int, int]  # (pid, tid)


def _stat(path: str) -> List[str]:
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ").strip()
    except OSError:
        return ""


def _parents() -> Dict[int, int]:
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parents[int(name)] = int(_stat(f"/proc/{name}/stat")[PPID_FIELD])
            except OSError:
                continue
    return parents


def _tree(root: int, parents: Dict[int, int]) -> List[int]:
    children = collections.defaultdict(list)
    for pid, ppid in parents.items():
        children[ppid].append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children[pid])
    return found


def _role(pid: int, parents: Dict[int, int], commands: Dict[int, str]) -> str:
    """The process's role, from its command and its parent's and grandparent's (`commands` is filled as read)."""
    def command(of: int) -> str:
        if of not in commands:
            commands[of] = _cmdline(of)
        return commands[of]

    parent = parents.get(pid, 0)
    if TORCHRUN in command(pid):
        return "torchrun"
    if TORCHRUN in command(parent):
        return "rank"
    if TORCHRUN in command(parents.get(parent, 0)):
        return "worker"
    return command(pid)[:60] or f"pid {pid}"


def snapshot(root: int) -> Dict[Key, Tuple[str, bool, float]]:
    """Every thread under `root`: its process's role, whether it is the main thread, its CPU seconds."""
    parents, commands = _parents(), {}
    found = {}
    for pid in _tree(root, parents):
        role = _role(pid, parents, commands)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in map(int, tids):
            try:
                fields = _stat(f"/proc/{pid}/task/{tid}/stat")
            except OSError:
                continue
            found[(pid, tid)] = (role, tid == pid, (int(fields[UTIME_FIELD]) + int(fields[STIME_FIELD])) / CLOCK_TICKS)
    return found


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay", type=float, default=10.0, help="seconds from the start to the first read")
    parser.add_argument("--window", type=float, default=5.0, help="seconds between the two reads")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    opts = parser.parse_args(argv)
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    if not command:
        parser.error("give the command to watch after --")
    job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(opts.delay)
    first, started = snapshot(job.pid), time.perf_counter()
    time.sleep(opts.window)
    last, wall = snapshot(job.pid), time.perf_counter() - started
    if job.poll() is not None:
        print("thread_cpu: the command ended inside the window: make --delay + --window shorter", file=sys.stderr)
    used: Dict[Tuple[str, str], float] = collections.Counter()
    threads: Dict[Tuple[str, str], int] = collections.Counter()
    for key, (role, is_main, cpu_s) in last.items():
        if key in first:
            group = (role, "main thread" if is_main else "other threads")
            used[group] += cpu_s - first[key][2]
            threads[group] += 1
    print(f"| role | threads | count | % of a core over {wall:.1f} s |\n|---|---|--:|--:|")
    for (role, kind), seconds in sorted(used.items(), key=lambda item: -item[1]):
        print(f"| {role} | {kind} | {threads[(role, kind)]} | {100.0 * seconds / wall:.1f} |")
    print(f"| all | | {sum(threads.values())} | {100.0 * sum(used.values()) / wall:.1f} |")
    job.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
