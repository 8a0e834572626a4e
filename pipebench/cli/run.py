"""The `run` verb's parser and entry: the sweep's expansion, checks and launch are `pipebench.sweep`'s.

`pipebench run transform=a,b workers=0,4` needs no `--multirun`: every job is composed and checked
before anything is measured (one-line errors, exit 2), `rounds=N` repeats the whole sweep
round-robin, and `calibrate=true` times the calibration workload first.
"""

import argparse
from importlib import resources

from pipebench.cli.common_args import add_baseline_job, add_config_dir, add_fresh, add_overrides
from pipebench.config.compose import CFG_PARTS, CONFIG_MODULE
from pipebench.sweep.launch import run_command, show_command

__all__ = ["add_parser", "main"]

# The config groups --help lists first, in the order a user picks them; any other group follows.
GROUP_ORDER = ("dataset", "transform", "loader", "consumer", "run", "suite")


def config_groups_help() -> str:
    """The `groups:` lines of --help, read from the installed config tree, so they list every
    config pipebench ships."""
    root = resources.files(CONFIG_MODULE)
    found = {group.name: sorted(entry.name.removesuffix(".yaml") for entry in group.iterdir()
                                if entry.name.endswith(".yaml"))
             for group in root.iterdir() if group.is_dir() and not group.name.startswith("_")}
    order = [g for g in GROUP_ORDER if g in found] + sorted(set(found) - set(GROUP_ORDER))
    return "\n".join(f"{'groups:' if i == 0 else '':<8}{group}={'|'.join(found[group])}"
                     for i, group in enumerate(g for g in order if found[g]))


RUN_EPILOG = f"""\
examples:
  pipebench run transform=yuv_mask workers=0            profile the seed chain in one process
  pipebench run transform=yuv_mask,yuv_mask_fast workers=0,2   a 4-job sweep, one table
  pipebench run dataset=image_folder dataset.path=/data/imgs loader.batch_size=64
  pipebench run --config-dir my_conf transform=my_chain  your own configs and transforms
  pipebench run workers=auto loader.batch_size=32,64   0 up to 2x the usable cores, times two batch sizes
  pipebench run --baseline workers=0 workers=0,2,4      speedups against the workers=0 job
  pipebench report results/<folder> [more folders --out merged]   tables and plots again, or merged

{config_groups_help()}
keys:   workers (a number, a list, range(0,9,2) or auto), trace=torch|viztracer|none, results_dir, rounds,
        calibrate, loader.* (batch_size, prefetch_factor, pin_memory, persistent_workers,
        multiprocessing_context=fork|spawn|forkserver, ...), run.*, consumer.*, dataset.*
sweeps: any key takes a comma list, range(start,stop[,step]) or choice(a,b,...)
check:  --cfg job|hydra|all [--resolve], --info [TOPIC]: every job of the sweep printed, none run
resume: re-running the same command resumes its latest unfinished folder (--fresh starts anew)
suites: suite=nightly   the nightly regression sweep (every chain, workers 0 and 2, 5 rounds)
ranks:  distributed.nproc=2   each job on 2 torchrun ranks (DistributedSampler, all-reduce each step);
        distributed.backend=auto|gloo|nccl, dataset=sharded_stream (an IterableDataset sharded by rank)
cluster: --config-dir examples/slurm hydra/launcher=pipebench_slurm   (pip install ".[slurm]")
"""


# What `--info` may show: Hydra's own topics, passed to Hydra as they are.
INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser(
        "run", help="run a benchmark job, or a sweep when any override is a comma list",
        description="Run jobs from Hydra overrides. A comma list, range() or choice() sweeps; "
                    "each job runs in a fresh process, one after another.",
        epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_dir(parser)
    add_baseline_job(parser, "job, e.g. workers=0", "job")
    add_fresh(parser, "run")
    # The flags a Hydra user types: --cfg, --resolve and --info print without running; -m and
    # --multirun are accepted, since every pipebench run sweeps already.
    parser.add_argument("--cfg", "-c", choices=CFG_PARTS,
                        help="print each job's composed config (job, hydra or all) and run nothing")
    parser.add_argument("--resolve", action="store_true", help="with --cfg: resolve interpolations first")
    parser.add_argument("--info", "-i", nargs="?", const="all", choices=INFO_TOPICS,
                        help="print Hydra's information for each job (default: all) and run nothing")
    parser.add_argument("--multirun", "-m", action="store_true",
                        help="accepted for Hydra habit: a comma list sweeps with or without it")
    add_overrides(parser, "transform=yuv_mask workers=0,4,8")


def main(args: argparse.Namespace) -> int:
    if args.cfg or args.info or args.resolve:
        return show_command(list(args.overrides), args.config_dir, args.cfg, args.resolve, args.info)
    return run_command(list(args.overrides), args.config_dir, args.baseline, args.fresh, ahead=args.job_ahead)
