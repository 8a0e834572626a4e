"""pipebench's multi-rank AU against a plain, hand-written DLIO-style loop on the same data and link.

`pipebench storage-check` judges AU (the emulated accelerator's busy share) over N ranks on one host.
Where its AU falls short of the shared bandwidth's arithmetic, is the shortfall pipebench's or the
host's? This runs both side by side at each N:

- **plain**: `torchrun --nproc-per-node N` of this file's own rank loop, written as DLIO writes its
  training loop: a DataLoader with a DistributedSampler, `next()`, a sleep of the step, a barrier
  after every step (DLIO's `comm.barrier()`), AU = the sleeps over the wall time after the first
  batch and the warm-up. Its dataset is pipebench's `storage_samples` built from the same overrides,
  reading through one shared link file this script makes, so both sides read the same bytes
  through the same emulated link; only the loop and its clocks differ.
- **pipebench**: `pipebench run ... distributed.nproc=N`, its summary's `au_pct` (the least rank's).

Rounds alternate the order (plain first in odd rounds), so drift hits both alike. Printed: a
markdown table of each N's AU on both sides (median of rounds), their difference, the arithmetic's
AU, min(1, M x S / (N x B x size)), and each side's CPU ms a sample: a rank's process tree (the rank
and its workers) over its window, the ranks' mean (pipebench's `process_cpu_ms_per_sample`).

    python benchmarks/plain_ranks_check.py                       # N = 1..4 at storage_track_check's defaults
    python benchmarks/plain_ranks_check.py --ranks 1 2 --rounds 1 --steps 20
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from storage_track_check import BYTES_PER_MB, add_link_arguments, link_overrides

RANK_ENTRY = "--rank-entry"


def rank_loop(out: Path, link: str, steps: int, overrides: Sequence[str]) -> None:
    """One rank of the plain loop (module doc): writes rank-R.json with its AU and samples/s."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    from pipebench.config.compose import compose_job_spec
    from pipebench.measure.host_load import own_cpu_s
    from pipebench.pipeline.build import build_dataset

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = compose_job_spec(list(overrides))
    spec = replace(spec, storage=replace(spec.storage, link=link))
    dataset = build_dataset(spec)
    batch, workers = spec.loader.batch_size, spec.workers
    loader = DataLoader(dataset, batch_size=batch, num_workers=workers, prefetch_factor=spec.loader.prefetch_factor,
                        sampler=DistributedSampler(dataset, shuffle=True, seed=spec.run.seed), drop_last=True)
    step_s = spec.consumer.step_ms / 1000.0
    batches = iter(loader)
    for _ in range(1 + workers * spec.loader.prefetch_factor):  # the first batch and the workers' backlog
        next(batches)
        time.sleep(step_s)
        dist.barrier()
    compute = 0.0
    cpu_before = own_cpu_s()
    start = time.perf_counter()
    for _ in range(steps):
        data = next(batches)
        began = time.perf_counter()
        time.sleep(step_s)
        compute += time.perf_counter() - began
        del data
        dist.barrier()
    wall = time.perf_counter() - start
    cpu_ms_per_sample = 1000.0 * (own_cpu_s() - cpu_before) / (steps * batch)
    (out / f"rank-{rank}.json").write_text(json.dumps({"au_pct": 100.0 * compute / wall,
                                                       "cpu_ms_per_sample": cpu_ms_per_sample}))
    dist.destroy_process_group()


def plain(n: int, opts: argparse.Namespace, scratch: Path) -> Tuple[float, float]:
    """The plain loop's AU at `n` ranks (the least rank's, as pipebench merges ranks) and its CPU
    ms a sample (the ranks' mean)."""
    from pipebench.config.compose import compose_job_spec
    from pipebench.storage.shared_link import opened_link

    out = Path(tempfile.mkdtemp(prefix=f"plain-{n}-", dir=scratch))
    with opened_link(compose_job_spec(link_overrides(opts))) as linked:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                   __file__, RANK_ENTRY, str(out), linked.storage.link, str(opts.steps), *link_overrides(opts)]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        sys.exit(f"plain loop failed at N={n}: {done.stderr.strip()[-800:]}")
    ranks = [json.loads(path.read_text()) for path in out.glob("rank-*.json")]
    return min(r["au_pct"] for r in ranks), statistics.fmean(r["cpu_ms_per_sample"] for r in ranks)


def harness(n: int, opts: argparse.Namespace, scratch: Path) -> Tuple[float, float]:
    """pipebench's AU and CPU ms a sample at `n` ranks: `pipebench run`'s summary."""
    done = subprocess.run(["pipebench", "run", *link_overrides(opts), f"run.steps={opts.steps}", "trace=none",
                           f"distributed.nproc={n}", f"results_dir={scratch}"], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith("results: "):
        sys.exit(f"pipebench run failed at N={n}: {done.stderr.strip()[-800:]}")
    folder = Path(lines[-1][len("results: "):])
    summary = json.loads(next(folder.rglob("result.json")).read_text())["summary"]
    return float(summary["au_pct"]), float(summary["process_cpu_ms_per_sample"])


def main(argv: List[str]) -> int:
    if argv and argv[0] == RANK_ENTRY:
        rank_loop(Path(argv[1]), argv[2], int(argv[3]), argv[4:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    add_link_arguments(parser)
    opts = parser.parse_args(argv)
    sides = {"plain": plain, "pipebench": harness}
    found: Dict[int, Dict[str, List[Tuple[float, float]]]] = {n: {side: [] for side in sides} for n in opts.ranks}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="plain-ranks-") as scratch:
        for round_ in range(opts.rounds):
            for n in opts.ranks:
                order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
                for side in order:
                    found[n][side].append(sides[side](n, opts, Path(scratch)))
                print(f"round {round_ + 1} N={n}: plain AU {found[n]['plain'][-1][0]:.1f}%, "
                      f"pipebench AU {found[n]['pipebench'][-1][0]:.1f}%", flush=True)
    link_bytes_per_step = opts.mb_per_s * BYTES_PER_MB * opts.step_ms / 1000.0
    print(f"\nM={opts.mb_per_s:g} MiB/s, S={opts.step_ms:g} ms, B={opts.batch}, size={opts.sample_bytes} B, "
          f"workers={opts.workers}, {opts.steps} steps, {opts.rounds} rounds ({time.perf_counter() - started:.0f} s)\n")
    print("| N | arithmetic AU | plain AU (rounds) | pipebench AU (rounds) | pipebench - plain, points | "
          "CPU ms a sample, plain / pipebench |")
    print("|--:|--:|---|---|--:|---|")
    for n, sides_found in found.items():
        expected = 100.0 * min(1.0, link_bytes_per_step / (n * opts.batch * opts.sample_bytes))
        (p, p_cpu), (h, h_cpu) = (list(zip(*sides_found[side])) for side in sides)
        print(f"| {n} | {expected:.1f} | {statistics.median(p):.1f} ({', '.join(f'{a:.1f}' for a in p)}) | "
              f"{statistics.median(h):.1f} ({', '.join(f'{a:.1f}' for a in h)}) | "
              f"{statistics.median(h) - statistics.median(p):+.1f} | "
              f"{statistics.median(p_cpu):.2f} / {statistics.median(h_cpu):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
