"""Flags that several verbs share, declared once (as asv's common_args.py does)."""

import argparse

__all__ = ["add_baseline_job", "add_config_dir", "add_fresh", "add_overrides"]


def add_config_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-dir", "-cd", help="a directory of your own configs, searched after pipebench's")


def add_fresh(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--fresh", action="store_true",
                        help=f"start a new results folder even if an identical earlier {what} was interrupted")


def add_overrides(parser: argparse.ArgumentParser, example: str) -> None:
    parser.add_argument("overrides", nargs="*", help=f"Hydra overrides, e.g. {example}")


def add_baseline_job(parser: argparse.ArgumentParser, example: str, default: str) -> None:
    parser.add_argument("--baseline", metavar="JOB",
                        help="the job speedups are measured against, as KEY=VALUE[,KEY=VALUE] pairs that name one "
                             f"{example} (default: the first {default})")
