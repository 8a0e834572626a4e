"""The `ab` verb: `pipebench ab BASE_REF [HEAD_REF] [OVERRIDES]`, two versions in one session.

A verb of its own, not a flag on `run`: it measures two trees, not one, and its exit statuses are
compare's, shaped for `git bisect run` (0 good, 1 a regression, 125 this commit cannot be
measured), where `run`'s mean "jobs failed". Without HEAD_REF the head is the work tree as it is.
"""

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Tuple

from pipebench.base.errors import ConfigError
from pipebench.cli.common_args import add_config_dir
from pipebench.config.compose import sweep_settings
from pipebench.regress.ab import (
    EXIT_GOOD,
    EXIT_REGRESSION,
    EXIT_SKIP,
    Plan,
    Side,
    SideFailed,
    run_session,
    session_folder,
)
from pipebench.regress.compare import DEFAULT_THRESHOLD, SLOWER, render_markdown, write_comparison
from pipebench.regress.git_tree import GitError, checked_out, dirty_paths, repo_root, resolve_commit
from pipebench.regress.history import append_session
from pipebench.sweep.expand import expand_sweep, import_from_cwd, search_path

__all__ = ["add_parser", "main"]

AB_EPILOG = """\
examples (options go before BASE_REF):
  pipebench ab HEAD~1 suite=nightly                 the work tree against its parent commit
  pipebench ab v1.2 v1.3 transform=yuv_mask_fast workers=0,2 rounds=6
  pipebench ab --base-python /envs/old/bin/python main suite=nightly   base side in another environment
  git bisect start BAD GOOD && git bisect run pipebench ab --rounds 4 GOOD suite=nightly
exit: 0 no regression, 1 a job `slower` (CPU time or both signals), 2 bad input (a ref, a dirty
      tree with --require-clean, an override), 125 a side could not be measured (bisect skips it)
"""


def _split_refs(items: list) -> tuple:
    """BASE_REF, then HEAD_REF unless the next item is an override (KEY=VALUE), then the overrides."""
    if not items or "=" in items[0]:
        raise ConfigError("ab needs BASE_REF first, e.g. `pipebench ab HEAD~1 suite=nightly`")
    head = items[1] if len(items) > 1 and "=" not in items[1] else None
    return items[0], head, items[2 if head else 1:]


# Rounds a side when neither --rounds nor the config asks for more than run's default of 1: as many
# as suite=nightly runs, one above the 4 a side the paired rule needs before it gives a verdict.
AB_DEFAULT_ROUNDS = 5
# What the session's header adds when it used that default.
DEFAULT_ROUNDS_NOTE = " (ab's default; --rounds N or rounds=N sets them)"


def _rounds(given, overrides: list, config_dir) -> Tuple[int, str]:
    """--rounds, else the sweep's rounds as the head's config composes them (suite=nightly: 5),
    else AB_DEFAULT_ROUNDS where nobody asked for any; at least 2, since the comparison pairs
    rounds. Returns the rounds and what the header says of where they came from."""
    if given:
        rounds = given
    else:
        rounds = sweep_settings([*search_path(config_dir), *expand_sweep(overrides)[0]]).rounds
        if rounds < 2 and not any(o.startswith("rounds=") for o in overrides):
            return AB_DEFAULT_ROUNDS, DEFAULT_ROUNDS_NOTE
    if rounds < 2:
        raise ConfigError(f"rounds={rounds}: an A/B session pairs rounds, it needs rounds >= 2")
    return rounds, ""


def main(args: argparse.Namespace) -> int:
    base_ref, head_ref, overrides = _split_refs(list(args.refs))
    cwd = Path.cwd().resolve()
    repo = repo_root(cwd)
    base_commit = resolve_commit(repo, base_ref)
    head_commit = resolve_commit(repo, head_ref or "HEAD")
    dirty = dirty_paths(repo) if head_ref is None else []
    if dirty and (args.require_clean or args.history):
        raise GitError(f"{repo}: uncommitted changes in {', '.join(dirty[:3])}{' ...' if len(dirty) > 3 else ''}; "
                       "commit or stash them (--require-clean / --history measure commits)")
    import_from_cwd()
    rounds, rounds_note = _rounds(args.rounds, overrides, args.config_dir)
    overrides = [o for o in overrides if not o.startswith("rounds=")]
    cwd_in_tree = cwd.relative_to(repo.resolve())
    with checked_out(repo, base_commit) as base_tree, \
            (nullcontext(repo) if head_ref is None else checked_out(repo, head_commit)) as head_tree:
        base = Side("base", base_tree, base_commit, args.base_python or sys.executable)
        head = Side("head", head_tree, head_commit, sys.executable, bool(dirty))
        return _measure(args, (base, head), overrides, (rounds, rounds_note), cwd_in_tree, cwd)


def _measure(args, sides: Tuple[Side, Side], overrides, rounds_said: Tuple[int, str], cwd_in_tree: Path,
             cwd: Path) -> int:
    base, head = sides
    rounds, rounds_note = rounds_said
    folder = session_folder(cwd / args.results_dir, base, head)
    print(f"A/B session: {base.describe()} vs {head.describe()}, {rounds} rounds alternating{rounds_note} -> {folder}",
          flush=True)
    try:
        session = run_session(base, head, Plan(tuple(overrides), rounds, folder, cwd_in_tree, args.config_dir),
                              args.threshold)
    except SideFailed as exc:
        print(f"pipebench: {exc}; exit {EXIT_SKIP} (cannot measure)", file=sys.stderr)
        return EXIT_SKIP
    write_comparison(session.comparison, str(folder))
    if session.version_note:
        print(session.version_note)
    print(render_markdown(session.comparison), end="")
    print(f"A/B session took {session.seconds:.0f} s; results: {folder}")
    if args.history:
        print(f"history: {append_session(Path(args.history), session)}")
    return EXIT_REGRESSION if session.comparison.counts()[SLOWER] else EXIT_GOOD


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser(
        "ab", help="measure two git refs in one session, interleaved, and compare them (bisect-ready exits)",
        description="Check BASE_REF out into a temporary git worktree, run every job of the sweep for both "
                    "trees round by round (alternating; each side one `pipebench run` paced a round at a "
                    "time, each round's jobs forked from a job process of its own, each side's tree on "
                    "PYTHONPATH), then compare throughput and CPU time a sample with rounds paired.",
        epilog=AB_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="pipebench ab [OPTIONS] BASE_REF [HEAD_REF] [OVERRIDES ...]",
    )
    parser.add_argument("refs", nargs="+", metavar="BASE_REF [HEAD_REF] [OVERRIDES ...]",
                        help="the base ref, optionally the head ref (default: the work tree), then Hydra overrides")
    add_config_dir(parser)
    parser.add_argument("--base-python", metavar="PATH",
                        help="the Python interpreter of the base side (another environment: a Pillow or torch change)")
    parser.add_argument("--rounds", type=int, help=f"rounds a side (default: the config's rounds, suite=nightly: 5; "
                                                   f"{AB_DEFAULT_ROUNDS} where the config asks for 1)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help=f"smallest relative change that counts (default: {DEFAULT_THRESHOLD})")
    parser.add_argument("--results-dir", default="results", help="the session goes in RESULTS_DIR/ab/ (default: results)")
    parser.add_argument("--require-clean", action="store_true",
                        help="refuse a work tree with uncommitted changes (the nightly and bisect measure commits)")
    parser.add_argument("--history", metavar="FILE",
                        help="append every job's figures and verdict to this per-machine history (implies a clean tree)")
