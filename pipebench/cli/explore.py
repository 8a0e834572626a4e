"""The `explore` verb: derive a chain's variants, check their equivalence, measure them all in one sweep."""

import argparse
from typing import List, Mapping, Optional

from pipebench.cli.common_args import add_config_dir, add_fresh, add_overrides
from pipebench.explore.chain import MOVE_HELP
from pipebench.explore.equivalence import DEFAULT_MAX_PIXEL_DIFF
from pipebench.explore.plan import (
    EXPLORE_DEFAULTS,
    NoVariants,
    plan_exploration,
    write_explore_table,
    write_plan,
)
from pipebench.explore.variants import LOADER_MOVE_HELP
from pipebench.record.folder_lock import folder_lock
from pipebench.record.resume import ready_for_sweep
from pipebench.sweep.expand import expand_sweep, import_from_cwd, refuse_hydra_dirs, search_path
from pipebench.sweep.launch import Into, run_command

# An 8-bit pixel differs from another by at most this.
MAX_GREY_LEVEL = 255

__all__ = ["add_parser", "main"]


def help_lines(title: str, entries: Mapping[str, str]) -> str:
    """`title` then one `name: what` line an entry, indented as --help's epilog blocks are."""
    return "\n".join(f"{title if i == 0 else '':<8}{name}: {text}" for i, (name, text) in enumerate(entries.items()))


EXPLORE_EPILOG = f"""\
examples:
  pipebench explore transform=yuv_mask                  the seed chain's variants at workers=0
  pipebench explore transform=yuv_mask workers=2 rounds=5
  pipebench explore --config-dir my_conf transform=my_chain   your chain; your transforms declare `movement`

{help_lines("moves:", MOVE_HELP)}
        ... and their combinations (docs/explore.md)
{help_lines("loader:", LOADER_MOVE_HELP)}
checks: identical / close (float tolerance; a reduced-size decode within --max-pixel-diff) /
        same distribution (KS test) / not equivalent / fails
writes: variants.json, equivalence.md|csv, variants/transform/*.yaml (to read; never read back),
        explore.md|csv, and what `run` writes
defaults: {' '.join(f"{k}={v}" for k, v in EXPLORE_DEFAULTS)} (interleaved rounds of short jobs), unless given
target: --target 90   stop at the first chain (base first) whose job keeps the consumer >= 90% busy
        (accel_util_pct; run.target_accel_util_pct, the diagnosis sizes workers and cores for the same)
"""


def target_overrides(target_pct: Optional[float]) -> List[str]:
    """`--target PCT`: the diagnosis's target, and the sweep stops at the first job that meets it."""
    if target_pct is None:
        return []
    return [f"run.target_accel_util_pct={target_pct:g}", "run.stop_at_target=true"]


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser(
        "explore", help="find a chain's faster variants, check they compute the same thing, measure them all",
        description="Move steps of one transform chain as its transforms declare (crop first, fast forms, "
                    "per-batch forms), check each variant for equivalence with the chain on the same seeds, "
                    "then measure every variant side by side in one interleaved sweep. Other overrides pass "
                    "through as with `run`.",
        epilog=EXPLORE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_dir(parser)
    add_fresh(parser, "exploration")
    parser.add_argument("--target", type=float, metavar="PCT", dest="target_pct",
                        help="stop at the first chain whose job reaches accel_util_pct >= PCT "
                             "(sets run.target_accel_util_pct and run.stop_at_target=true)")
    parser.add_argument("--max-pixel-diff", type=_grey_levels, default=DEFAULT_MAX_PIXEL_DIFF, metavar="LEVELS",
                        help="the largest pixel difference, in grey levels, that a decode move (decoder, "
                             "tensor_path, reduced_decode) may make and still be called close (default "
                             f"{DEFAULT_MAX_PIXEL_DIFF}: what two JPEG decoders differ by). A reduced-size decode "
                             "differs by up to ~54 levels at grainy edges: raise it to 64 to accept it")
    add_overrides(parser, "transform=yuv_mask workers=2")


def main(args: argparse.Namespace) -> int:
    """Generate the chain's variants, check their equivalence, then measure them all in one sweep
    (or up to the first chain that meets --target)."""
    import_from_cwd()
    refuse_hydra_dirs(args.overrides)
    overrides = [*args.overrides, *target_overrides(args.target_pct)]
    plan = plan_exploration(overrides, expand_sweep([*search_path(args.config_dir), *overrides])[0],
                            args.fresh, args.max_pixel_diff)
    if isinstance(plan, NoVariants):
        print(f"pipebench explore: no variants of transform={plan.base}: {'; '.join(plan.reasons)}")
        return 0
    with folder_lock(plan.invocation_dir):
        ready_for_sweep(plan.invocation_dir)  # before its variants are written there
        print(f"\n## equivalence with {plan.checked[0].variant.name}\n\n{write_plan(plan)}", end="")
        measured = [item for item in plan.checked if item.measured]
        if plan.resumed is not None:
            print(f"resuming {plan.invocation_dir}: {plan.resumed.done} of {plan.resumed.total} jobs already done",
                  flush=True)
        print(f"explore: measuring {len(measured)} chains, interleaved, in one sweep", flush=True)
        return run_command(list(plan.overrides), args.config_dir, ahead=args.job_ahead, into=Into(
            plan.invocation_dir, epilogue=lambda folder: print(f"## explore\n\n{write_explore_table(folder, plan)}")))


def _grey_levels(text: str) -> int:
    """An argparse type: a whole number of grey levels, 0 to 255."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_GREY_LEVEL:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of grey levels from 0 to {MAX_GREY_LEVEL}, got {text!r}")
    return value
