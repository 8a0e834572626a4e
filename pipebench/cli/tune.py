"""The `tune` verb's parser and entry: the loader settings for the user's chain, found with
statistics within a budget. The sequence (probe, prune, race, recommend, verify) is
`pipebench.tune.session`'s.
"""

import argparse
import math

from pipebench.cli.common_args import add_config_dir, add_fresh, add_overrides
from pipebench.config.limits import MAX_TUNE_BUDGET_S
from pipebench.tune.session import DEFAULT_BUDGET_S, TuneRequest, tune_command

__all__ = ["add_parser", "main"]

TUNE_EPILOG = """\
examples:
  pipebench tune transform=yuv_mask                         the seed chain's loader settings, 5 minutes
  pipebench tune --budget-s 900 --target-starvation 10 consumer=toy_cnn   fewest workers keeping the model fed
  pipebench tune --max-pss-gib 8 tune.batch_sizes=[64,128]  a memory cap; the batch size searched too
  pipebench tune tune.search=optuna                          Optuna's TPE picks which points race (the tune extra)

space:  tune.workers=[..] (default: the model's ladder, up to its knee), tune.backends=[..] (every installed one),
        tune.prefetch_factors=[2,4], tune.persistent_workers=[false,true], tune.pin_memory (with CUDA only),
        tune.batch_sizes=[..] (only when given), tune.variants=true (explore's equivalent chains, its winners)
race:   tune.rounds=2 a stage, tune.stages=3 (each twice as long), tune.verify_rounds=4
writes: tune.csv, best.yaml, tune.md with tune.png, conf/ (the chain's config), and probe/, race-N/, verify/
resume: the same command again resumes an interrupted tune (only unfinished trials run); --fresh starts anew
"""


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser(
        "tune", help="find the loader settings for your chain: the model prunes, interleaved rounds race the rest",
        description="Search workers, loader.backend, prefetch_factor, persistent_workers, pin_memory (with CUDA), "
                    "the batch size (where allowed) and explore's equivalent chains for the chain the overrides "
                    "compose to. The cost model prunes first, each dropped point with its reason; short interleaved "
                    "rounds race the rest, longer rounds those the intervals cannot yet tell from the best, within "
                    "the budget. Ends with the settings within noise of the best and the cheapest of them.",
        epilog=TUNE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_dir(parser)
    parser.add_argument("--budget-s", type=_positive, default=DEFAULT_BUDGET_S, metavar="S",
                        help=f"wall-clock seconds for the whole search (default {DEFAULT_BUDGET_S:g}, at most "
                             f"{MAX_TUNE_BUDGET_S:g})")
    add_fresh(parser, "tune")
    parser.add_argument("--target-starvation", type=_percent, metavar="PCT",
                        help="find the fewest workers that keep starvation under PCT (10: MLPerf Storage's AU >= 90%%)")
    parser.add_argument("--max-pss-gib", type=_positive, metavar="G",
                        help="only settings whose summed PSS (main process and workers) stays under G GiB")
    add_overrides(parser, "transform=yuv_mask tune.workers=[0,2,4]")


def main(args: argparse.Namespace) -> int:
    return tune_command(TuneRequest(tuple(args.overrides), args.config_dir, args.budget_s, args.target_starvation,
                                    args.max_pss_gib, args.fresh), args.job_ahead)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}")
    return value


def _positive(text: str) -> float:
    """An argparse type: a finite number above 0."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
    return value


def _percent(text: str) -> float:
    """An argparse type: a share of step time, above 0 and below 100."""
    value = _number(text)
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError(f"must be a percentage above 0 and below 100, got {text!r}")
    return value
