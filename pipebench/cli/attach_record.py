"""`attach --record`'s flags (the flight recorder, docs/attach.md "Recording a whole run"), kept
apart from the attach verb's own: `add_record_args` adds them, `recording_of` reads them."""

import argparse
from typing import Optional

from pipebench.attach.recorder import DEFAULT_EVERY_S, RecordSettings
from pipebench.attach.recorder_files import DEFAULT_MAX_CAPTURES
from pipebench.attach.recorder_stalls import DEFAULT_MIN_DROP, DEFAULT_MIN_RISE_PCT, StallRule
from pipebench.attach.recording import Recording
from pipebench.attach.sinks.sink_set import SinkSpec
from pipebench.base.errors import ConfigError

__all__ = ["add_record_args", "recording_of"]


def add_record_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("recording the whole run (--record)")
    group.add_argument("--record", action="store_true",
                       help="keep measuring for the whole run: a row a window a loader in series.csv, stalls "
                            "caught and captured (capture-N/), events.csv")
    group.add_argument("--every-steps", type=int, metavar="N", help="a window every N steps (instead of --every-s)")
    group.add_argument("--every-s", type=float, default=DEFAULT_EVERY_S, metavar="S",
                       help=f"a window every S seconds (default {DEFAULT_EVERY_S:g})")
    group.add_argument("--stall-rise", type=float, default=DEFAULT_MIN_RISE_PCT, metavar="POINTS",
                       help="a stall's least rise of starvation over the run's baseline, in points "
                            f"(default {DEFAULT_MIN_RISE_PCT:g}), beyond the baseline's noise too")
    group.add_argument("--stall-drop", type=float, default=DEFAULT_MIN_DROP, metavar="FRACTION",
                       help=f"a stall's least fall of samples/s below the baseline (default {DEFAULT_MIN_DROP:g})")
    group.add_argument("--max-captures", type=int, default=DEFAULT_MAX_CAPTURES, metavar="K",
                       help=f"keep at most K capture folders, the worst stalls (default {DEFAULT_MAX_CAPTURES})")
    group.add_argument("--tensorboard", metavar="DIR", help="push each window to TensorBoard event files in DIR")
    group.add_argument("--mlflow", metavar="URI", help="push each window to MLflow (a file: or sqlite: store works)")
    group.add_argument("--wandb", metavar="PROJECT", help="push each window to W&B (offline unless WANDB_MODE says)")
    group.add_argument("--prometheus-port", type=int, metavar="P",
                       help="serve each loader's last window on http://localhost:P/metrics (rank K: P+K)")


def recording_of(args: argparse.Namespace) -> Optional[Recording]:
    """The Recording asked for; None without --record. A sink without --record is refused."""
    sinks = SinkSpec(args.tensorboard, args.mlflow, args.wandb, args.prometheus_port)
    if not args.record:
        if sinks.any or args.every_steps is not None:
            raise ConfigError("--every-steps, --tensorboard, --mlflow, --wandb and --prometheus-port record the "
                              "whole run: add --record")
        return None
    try:
        rule = StallRule(min_rise_pct=args.stall_rise, min_drop=args.stall_drop)
        return Recording(RecordSettings(args.every_steps, args.every_s, rule, args.max_captures), sinks)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
