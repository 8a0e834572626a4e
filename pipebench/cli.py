"""The `pipebench` command: verbs on top, Hydra overrides underneath.

`pipebench run transform=a,b workers=0,4` needs no `--multirun`: the CLI parses the overrides
with Hydra's own parser, checks every job of the sweep up front (one-line errors, exit 2,
before anything is measured), then hands the sweep to Hydra with pipebench's launcher.
"""

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import hydra
# BasicSweeper's own expansion, so the jobs checked up front are exactly the jobs Hydra runs.
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException

from pipebench.build import build_dataset, build_transforms
from pipebench.configs import CONFIG_MODULE, CONFIG_NAME, HYDRA_VERSION_BASE, job_spec_composer, one_line
from pipebench.errors import USAGE_EXIT_STATUS, ConfigError, PipebenchError
from pipebench.job import run_job_task
from pipebench.job_process import INTERRUPTED_EXIT_STATUS
from pipebench.results import SUMMARY_MD
from pipebench.schema import register_schema
from pipebench.specs import JobSpec

# Longest label in a results folder name; the full overrides are in every result.json.
MAX_LABEL_CHARS = 60

RUN_EPILOG = """\
examples:
  pipebench run transform=yuv_mask workers=0            profile the seed chain in one process
  pipebench run transform=yuv_mask,yuv_mask_fast workers=0,2   a 4-job sweep, one table
  pipebench run dataset=image_folder dataset.path=/data/imgs loader.batch_size=64
  pipebench run --config-dir my_conf transform=my_chain  your own configs and transforms

groups: dataset=synthetic_jpeg|image_folder|random_tensors
        transform=yuv_mask|yuv_mask_fast|yuv_mask_crop_first|yuv_mask_batched
        loader=default|seed  run=default|quick  consumer=emulated|none|toy_cnn
keys:   workers, trace=torch|viztracer|none, results_dir, loader.*, run.*, consumer.*, dataset.*
"""


def _label(overrides: Sequence[str]) -> str:
    """A folder-safe label from the overrides, e.g. `transform-yuv_mask_workers-0+4+8`."""
    parts = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.startswith(("hydra.", "results_dir")):
            continue
        parts.append(f"{key.split('.')[-1].lstrip('+~')}-{value.replace(',', '+')}")
    label = re.sub(r"[^A-Za-z0-9_.+-]", "", "_".join(parts))[:MAX_LABEL_CHARS]
    return label or "default"


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def expand_sweep(overrides: Sequence[str]) -> List[List[str]]:
    """Every job's overrides, expanded the way Hydra's BasicSweeper does (comma lists, range, choice)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        return BasicSweeper.split_arguments(parsed, None)[0]
    except HydraException as exc:
        raise ConfigError(one_line(exc)) from exc


def preflight(jobs: Sequence[Sequence[str]]) -> List[Tuple[JobSpec, str]]:
    """Compose and check every job, and build each distinct dataset once, before measuring anything.

    Returns each job's spec with its results_dir.
    """
    checked = []
    datasets_built = set()
    with job_spec_composer() as compose_one:
        for job in jobs:
            spec, results_dir = compose_one(job)
            build_transforms(spec.per_sample, "transform.per_sample")
            build_transforms(spec.per_batch, "transform.per_batch")
            key = repr(sorted(spec.dataset.items())) + f"|{spec.loader.batch_size}|{spec.loader.drop_last}"
            if key not in datasets_built:
                build_dataset(spec)
                datasets_built.add(key)
            checked.append((spec, results_dir))
    return checked


def _hydra_entry():
    register_schema(ConfigStore.instance())
    return hydra.main(config_path=f"pkg://{CONFIG_MODULE}", config_name=CONFIG_NAME,
                      version_base=HYDRA_VERSION_BASE)(run_job_task)


def run_command(overrides: List[str], config_dir: Optional[str]) -> int:
    # User modules named by `_target_` resolve from the working directory, as with `python -m`.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if config_dir is not None:
        if not Path(config_dir).is_dir():
            raise ConfigError(f"--config-dir {config_dir}: no such directory")
        overrides = [f"hydra.searchpath=[{_quote('file://' + str(Path(config_dir).resolve()))}]", *overrides]
    jobs = expand_sweep(overrides)
    checked = preflight(jobs)
    results_dir = checked[0][1]
    invocation_dir = Path(results_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{_label(overrides)}"
    sys.argv = ["pipebench", "--multirun", *overrides, f"hydra.sweep.dir={_quote(str(invocation_dir))}"]
    status = 0
    try:
        _hydra_entry()()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        print("\npipebench: interrupted; finished jobs are kept", file=sys.stderr)
        status = INTERRUPTED_EXIT_STATUS
    summary = invocation_dir / SUMMARY_MD
    if summary.exists():
        print("\n## summary\n")
        print(summary.read_text())
    print(f"results: {invocation_dir}")
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipebench",
        description="Benchmark PyTorch data-input pipelines: per-transform profiles, throughput, starvation.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    run = verbs.add_parser(
        "run", help="run a benchmark job, or a sweep when any override is a comma list",
        description="Run jobs from Hydra overrides. A comma list, range() or choice() sweeps; "
                    "each job runs in a fresh process, one after another.",
        epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--config-dir", "-cd", help="a directory of your own configs, searched after pipebench's")
    run.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. transform=yuv_mask workers=0,4,8")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.verb == "run":
            return run_command(list(args.overrides), args.config_dir)
    except PipebenchError as exc:
        print(f"pipebench: error: {exc}", file=sys.stderr)
        return USAGE_EXIT_STATUS
    raise AssertionError(f"unhandled verb {args.verb}")


if __name__ == "__main__":
    sys.exit(main())
