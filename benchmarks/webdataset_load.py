"""WebDataset against the image folder at workers=0, taken apart: where a sample's extra time goes.

The same --images JPEGs as an image folder, as `pipebench dataset convert`'s shards, and as shards that
webdataset's ShardWriter writes with its defaults (a float mtime, so a PAX header before each member).
Two tables:

1. Each through pipebench's own timed chain (transform=imagenet, one intra-op thread, as a workers=0
   job runs it) in a plain DataLoader at workers=0, one batch of each in turn, so other tenants' load
   falls on all of them alike: ms a sample, wall and each row, and the ratio to the folder's rate.
2. The load row's stages in a plain loop, each adding one to the last: the shard's bytes, Python's tarfile
   in stream mode (as webdataset opens a shard, members read), webdataset's tar_file_expander and
   group_by_keys, pipebench's stream (FileReads, the split stages, each sample's index), then the image
   opened lazily (PIL's header parse) and the label: the load row. The folder's load beside them.

    python benchmarks/webdataset_load.py                    # 500 images, 15 batches a format, 5 passes
    python benchmarks/webdataset_load.py --images 64 --batches 2 --passes 1   # that it works
"""

import argparse
import statistics
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List

import numpy as np
import torch
import webdataset as wds
import yaml
from torch.utils.data import DataLoader, IterableDataset

from formats import pipebench
from pipebench.base.tables import markdown_table
from pipebench.datasets.image_folder import ImageFolderDataset
from pipebench.datasets.synthetic_jpeg import SyntheticJpegDataset
from pipebench.datasets.webdataset_shards import SHARD_PATTERN, WebDatasetShards
from pipebench.pipeline.build import build_transforms
from pipebench.pipeline.timed_chain import InstrumentedDataset, TimedCollate
from pipebench.pipeline.timed_iterable import InstrumentedIterable

BATCH = 32
SHARD_SIZE = 250
CHAIN = Path(__file__).resolve().parent.parent / "conf" / "transform" / "imagenet.yaml"
FOLDER, CONVERTED, SHARD_WRITER = "image_folder", "convert's shards", "ShardWriter's defaults"


def write_default_shards(folder: Path, out: Path) -> None:
    """The folder's images as webdataset's ShardWriter writes them with its defaults (a float mtime)."""
    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / SHARD_PATTERN), maxcount=SHARD_SIZE, verbose=0) as sink:
        for number, path in enumerate(sorted(folder.rglob("*.jpg"))):
            sink.write({"__key__": f"{number:08d}", "jpg": path.read_bytes(), "cls": b"0"})


def datasets(work: Path, images: int) -> Dict[str, Callable[[], Any]]:
    """Each format's dataset, built fresh when called; the corpus and shards written once into `work`."""
    folder = SyntheticJpegDataset(length=images, num_images=images, cache_dir=work / "jpegs").cache_path
    converted, default = work / "converted", work / "shard_writer"
    if not converted.exists():
        pipebench(["dataset", "convert", "--to", "webdataset", "--out", str(converted), "--shard-size",
                   str(SHARD_SIZE), "dataset=image_folder", f"dataset.path={folder}"])
    if not default.exists():
        write_default_shards(folder, default)
    return {FOLDER: lambda: ImageFolderDataset(folder),
            CONVERTED: lambda: WebDatasetShards(sorted(str(p) for p in converted.glob("*.tar"))),
            SHARD_WRITER: lambda: WebDatasetShards(sorted(str(p) for p in default.glob("*.tar")))}


def timed_loader(dataset: Any) -> DataLoader:
    """The dataset through pipebench's timed chain (transform=imagenet) in a DataLoader at workers=0."""
    chain = build_transforms(yaml.safe_load(CHAIN.read_text())["per_sample"], "transform.per_sample")
    iterable = isinstance(dataset, IterableDataset)
    wrapped = (InstrumentedIterable if iterable else InstrumentedDataset)(dataset, chain)
    return DataLoader(wrapped, batch_size=BATCH, shuffle=not iterable, num_workers=0, collate_fn=TimedCollate([]))


def lockstep(made: Dict[str, Callable[[], Any]], batches: int) -> List[Dict[str, object]]:
    """Table 1: a batch of each format in turn (the order reversed every other batch)."""
    torch.set_num_threads(1)
    loaders = {name: timed_loader(make()) for name, make in made.items()}
    names = ["load"] + [step.name for step in loaders[FOLDER].dataset.steps[1:]] + ["collate"]
    iterators = {name: iter(loader) for name, loader in loaders.items()}
    wall, samples = dict.fromkeys(loaders, 0), dict.fromkeys(loaders, 0)
    rows = {name: np.zeros(len(names)) for name in loaders}
    for k in range(batches):
        for name in (list(iterators) if k % 2 else list(reversed(iterators))):
            start = time.perf_counter_ns()
            batch = next(iterators[name])
            wall[name] += time.perf_counter_ns() - start
            rows[name] += np.append(batch.sample_ns.sum(axis=0), batch.batch_ns.sum())
            samples[name] += len(batch.sample_ns)
    ms = {name: wall[name] / samples[name] / 1e6 for name in loaders}
    return [{"format": name, "x_image_folder": round(ms[FOLDER] / ms[name], 3), "wall_ms": round(ms[name], 3),
             **{row: round(value / samples[name] / 1e6, 3) for row, value in zip(names, rows[name])},
             "outside_rows_ms": round(ms[name] - rows[name].sum() / samples[name] / 1e6, 3)} for name in loaders]


def load_stages(shards: WebDatasetShards) -> Dict[str, Callable[[], Iterable[Any]]]:
    """The load row's stages for `shards`, each a fresh iterator over one epoch when called."""
    tariter = wds.tariterators

    def read_bytes() -> Iterable[Any]:
        for url in shards.urls:
            with open(url, "rb") as f:
                while f.read(1 << 16):
                    pass
        return range(len(shards))

    def tar_stream() -> Iterable[Any]:
        for url in shards.urls:
            with open(url, "rb") as f, tarfile.open(fileobj=f, mode="r|*") as tar:
                for member in tar:
                    data = tar.extractfile(member).read()
                    if member.name.endswith(".jpg"):
                        yield data

    def members() -> Iterable[Any]:
        return tariter.tar_file_expander({"url": url, "stream": open(url, "rb")} for url in shards.urls)

    def pipebench_stream() -> Iterable[Any]:
        sources = wds.split_by_worker(wds.split_by_node({"url": url} for url in shards.urls))
        return shards._indexed(tariter.group_by_keys(tariter.tar_file_expander(shards._opened(sources))))

    return {"shard bytes": read_bytes, "tarfile stream": tar_stream, "+ tar_file_expander": members,
            "+ group_by_keys": lambda: tariter.group_by_keys(members()), "+ pipebench's stream": pipebench_stream,
            "+ image opened, label: the load row": lambda: iter(shards)}


def split(made: Dict[str, Callable[[], Any]], passes: int) -> List[Dict[str, object]]:
    """Table 2: each stage's ms a sample (members counted as their sample), the median of `passes`
    interleaved passes over the set."""
    folder = made[FOLDER]()
    stages = {(stage, name): run for name in (CONVERTED, SHARD_WRITER)
              for stage, run in load_stages(made[name]()).items()}
    stages["image folder's load", FOLDER] = lambda: (folder[i] for i in range(len(folder)))
    times: Dict[Any, List[float]] = {key: [] for key in stages}
    for _ in range(passes):
        for key, run in stages.items():
            start = time.perf_counter_ns()
            for _ in run():
                pass
            times[key].append((time.perf_counter_ns() - start) / len(folder) / 1e6)
    return [{"stage": stage, "format": name, "ms_a_sample": round(statistics.median(t), 3),
             "range": f"{min(t):.3f}-{max(t):.3f}"} for (stage, name), t in times.items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--batches", type=int, default=15, help="batches of each format in table 1")
    parser.add_argument("--passes", type=int, default=5, help="passes over the set in table 2")
    parser.add_argument("--work", type=Path, default=Path("results/webdataset_load"))
    args = parser.parse_args()
    if args.batches * BATCH > args.images:
        sys.exit(f"--batches {args.batches} of {BATCH} needs at least {args.batches * BATCH} images")
    made = datasets(args.work, args.images)
    table = lockstep(made, args.batches)
    print(markdown_table(table, list(table[0])))
    print()
    print(markdown_table(split(made, args.passes), ["stage", "format", "ms_a_sample", "range"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
