"""The `dataset` verb: `dataset convert` writes a dataset's images in a shard format with that format's
own writer, so the same images can be measured as an image folder, tar shards, Parquet and LitData.

It reads the dataset the overrides compose (the synthetic corpus by default) file by file: each image's
encoded bytes as they are on disk, never decoded again, and its label; it ends with the `pipebench run`
command that reads what it wrote. The files go into a hidden folder beside `--out`, renamed to it once
the writer has finished, so a convert that fails (a full disk, Ctrl-C) leaves no half-written shard:
the folder is whole or absent. A full disk is one line naming the file, as `run` says it.
"""

import argparse
import os
import secrets
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

from torch.utils.data import IterableDataset
from tqdm import tqdm

from pipebench.base.errors import ConfigError, PipebenchError, error_line
from pipebench.base.io import NAME_TOKEN_BYTES, with_name
from pipebench.cli.common_args import add_config_dir, add_overrides
from pipebench.config.compose import compose_job_spec
from pipebench.datasets.litdata_chunks import write_litdata
from pipebench.datasets.parquet_rows import write_parquet
from pipebench.datasets.shard_split import require_library
from pipebench.datasets.webdataset_shards import write_shards
from pipebench.pipeline.instantiate import instantiate_node
from pipebench.storage.dataset_contract import told
from pipebench.sweep.expand import import_from_cwd, search_path

__all__ = ["FORMATS", "add_parser", "convert", "encoded_samples", "main"]

# Each format's writer (samples, out folder, shard size, progress) -> files written.
FORMATS: Dict[str, Callable[..., List[str]]] = {"webdataset": write_shards, "parquet": write_parquet,
                                                 "litdata": write_litdata}
# The library each format's writer needs (the `formats` extra), checked before --out is created.
LIBRARIES = {"webdataset": "webdataset", "parquet": "pyarrow.parquet", "litdata": "litdata"}
# What each format's files are called in the closing line.
UNITS = {"webdataset": "shard", "parquet": "file", "litdata": "chunk"}
# Samples a shard (a tar shard, a Parquet file): about 125 MB of the corpus's 533x800 JPEGs, inside the
# 100 MB-1 GB webdataset advises, so a 1.28M-image set makes 1,280 shards, enough for any workers.
DEFAULT_SHARD_SIZE = 1000


def encoded_samples(dataset: Any) -> Iterator[Tuple[str, bytes, int]]:
    """(file, its bytes, label) for each sample of a map-style dataset whose samples are image files:
    `describe(i)` names one of its `files()`, as synthetic_jpeg and image_folder do. Checked before the
    first sample is asked for."""
    contract = told(dataset)
    if isinstance(dataset, IterableDataset) or contract.describe(0) not in set(contract.files()):
        raise ConfigError(f"dataset convert reads a dataset of image files; {type(dataset).__name__} is not one "
                          "(use dataset=synthetic_jpeg or dataset=image_folder)")
    return (_encoded(dataset, index) for index in range(len(dataset)))


def _encoded(dataset: Any, index: int) -> Tuple[str, bytes, int]:
    path = dataset.describe(index)
    image, label = dataset[index]
    getattr(image, "close", lambda: None)()
    with open(path, "rb") as f:
        return path, f.read(), int(label)


def _quoted(key: str, value: str) -> str:
    """`key="value"` as a shell word: Hydra's grammar wants a brace pattern or a glob in double quotes."""
    return shlex.quote(f'{key}="{value}"')


def _run_command(to: str, out: Path, written: List[str]) -> str:
    """The `pipebench run` line that reads the files written."""
    if to == "webdataset":
        numbers = [Path(path).stem.split("-")[-1] for path in written]
        urls = str(out / f"shard-{{{numbers[0]}..{numbers[-1]}}}.tar") if len(written) > 1 else written[0]
        return f"pipebench run dataset=webdataset {_quoted('dataset.urls', urls)}"
    if to == "litdata":
        return f"pipebench run dataset=litdata {_quoted('dataset.input_dir', str(out))}"
    return f"pipebench run dataset=parquet {_quoted('dataset.files', str(out / '*.parquet'))}"


def convert(to: str, out: Path, shard_size: int, overrides: List[str]) -> List[str]:
    """Write the dataset `overrides` compose as format `to` under `out`; returns the files written."""
    if to not in FORMATS:
        raise ConfigError(f"--to must be one of {', '.join(FORMATS)}, got {to!r}")
    if shard_size < 1:
        raise ConfigError(f"--shard-size must be at least 1, got {shard_size}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty folder; name a new one")
    require_library(LIBRARIES[to], f"dataset convert --to {to}")
    spec = compose_job_spec(overrides)
    dataset = instantiate_node(spec.dataset, "dataset")
    samples = encoded_samples(dataset)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.{secrets.token_hex(NAME_TOKEN_BYTES)}.tmp")
    try:
        staging.mkdir()
        with tqdm(total=len(dataset), unit="img", desc=f"{spec.dataset_name} -> {to}", disable=None) as bar:
            written = FORMATS[to](samples, staging, shard_size, lambda done: bar.update(done - bar.n))
        os.replace(staging, out)  # an empty --out is replaced whole
    except OSError as exc:
        # The line is made while the half-written files still fill the disk: the space it names is the
        # space the writer met.
        line = error_line(with_name(exc, out / _last_written(staging).relative_to(staging)))
        raise PipebenchError(line) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [str(out / Path(path).relative_to(staging)) for path in written]


def _last_written(folder: Path) -> Path:
    """The file under `folder` written last (the one a full disk cut), else `folder` itself."""
    files = [path for path in folder.rglob("*") if path.is_file()]
    return max(files, key=lambda path: path.stat().st_mtime_ns, default=folder)


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser("dataset", help="write a dataset's images as WebDataset shards, Parquet files or LitData "
                                              "chunks")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    convert_parser = actions.add_parser(
        "convert", help="write the dataset the overrides name (default: the synthetic corpus) in a shard format",
        description="Write every image of a dataset (dataset=synthetic_jpeg, the default, or dataset=image_folder "
                    "dataset.path=DIR) as WebDataset tar shards (webdataset's ShardWriter: key.jpg + key.cls) or "
                    "Parquet files (pyarrow: HF's image struct and a label column) or LitData chunks (litdata's writer: "
                    "{index, image, label} items), its encoded bytes unchanged.",
    )
    convert_parser.add_argument("--to", required=True, choices=sorted(FORMATS), help="the format to write")
    convert_parser.add_argument("--out", required=True, help="a new (or empty) folder for the shards or files")
    convert_parser.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE,
                                help=f"samples a tar shard, a Parquet file or a LitData chunk (default: {DEFAULT_SHARD_SIZE})")
    add_config_dir(convert_parser)
    add_overrides(convert_parser, "dataset=image_folder dataset.path=/data/imgs")


def main(args: argparse.Namespace) -> int:
    import_from_cwd()
    out = Path(args.out).expanduser()
    written = convert(args.to, out, args.shard_size, [*search_path(args.config_dir), *args.overrides])
    print(f"wrote {len(written)} {UNITS[args.to]}(s) to {out}", file=sys.stderr)
    print(_run_command(args.to, out, written))
    return 0
