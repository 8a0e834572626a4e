"""The same images as an image folder, WebDataset shards, Parquet files and LitData chunks, side by side.

The synthetic corpus generator writes --images distinct JPEGs (533x800, quality 90, about 125 KB each)
once into --work; `pipebench dataset convert` writes that folder as tar shards, Parquet files and
LitData chunks; then one `pipebench run` a format measures the same chain at the same worker counts,
and `pipebench report` merges the four folders into one table. Every step is the command a user types.

The check (issue 38's target): at workers=0, where the decode dominates, each format reads within 5%
of the image folder's samples/s, or the table's load row says what the format's read adds.

It prints one table, a row a (format, workers): samples/s (the mean over rounds), the ratio to the image
folder's at the same workers, the load step's ms a sample beside the folder's, and at workers=0 whether
the target holds; the same table, with the machine named, goes to WORK/formats.md and its figures to
WORK/formats.csv. `pipebench report`'s whole report (each job, the diagnosis, the plots) is in
WORK/side-by-side/.

    python benchmarks/formats.py                               # 2,000 images, transform=imagenet, workers 0,2
    python benchmarks/formats.py --images 32 --steps 5 --shard-size 8 --workers 0   # a check that it works
"""

import argparse
import csv
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Mapping, Sequence, Tuple

from pipebench.base.cores import usable_cores
from pipebench.base.tables import markdown_table
from pipebench.datasets.synthetic_jpeg import SyntheticJpegDataset
from pipebench.measure.fingerprint import cpu_model

NUM_IMAGES = 2_000
# The target: each format within 5% of the folder's samples/s at workers=0.
TOLERANCE = 0.05
FORMATS = ("webdataset", "parquet", "litdata")
FOLDER = "image_folder"
# The table's columns, printed and written (formats.md, formats.csv).
COLUMNS = ("format", "workers", "samples_per_s", "x_image_folder", "load_ms_per_sample",
           "image_folder_load_ms_per_sample", "within_target")
PIPEBENCH = str(Path(sys.executable).with_name("pipebench"))


def pipebench(args: Sequence[str]) -> str:
    """Run `pipebench ARGS` as a user would; its stdout, or exit with its error."""
    done = subprocess.run([PIPEBENCH, *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"pipebench {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def results_folder(stdout: str) -> str:
    return stdout.strip().splitlines()[-1].removeprefix("results: ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=NUM_IMAGES)
    parser.add_argument("--shard-size", type=int, default=250, help="samples a shard or file (default: 250, 8 shards)")
    parser.add_argument("--transform", default="imagenet")
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--steps", type=int, default=None, help="run.steps (default: pipebench's)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("results/formats"), help="images, shards and results")
    args = parser.parse_args()

    started = time.perf_counter()
    corpus = SyntheticJpegDataset(length=args.images, num_images=args.images, cache_dir=args.work / "jpegs")
    folder = [f"dataset={FOLDER}", f"dataset.path={corpus.cache_path}"]
    sources = {FOLDER: folder}
    for name in FORMATS:
        out = args.work / name
        shutil.rmtree(out, ignore_errors=True)
        command = pipebench(["dataset", "convert", "--to", name, "--out", str(out), "--shard-size",
                             str(args.shard_size), *folder]).strip()
        sources[name] = shlex.split(command)[2:]  # its last line: `pipebench run dataset=NAME 'dataset.urls=...'`
    print(f"{args.images} images in {len(sources)} formats under {args.work} ({time.perf_counter() - started:.0f} s)", flush=True)

    common = [f"transform={args.transform}", f"workers={args.workers}", f"rounds={args.rounds}", "consumer=none",
              "run.progress=false", f"results_dir={args.work / 'runs'}",
              *([f"run.steps={args.steps}", "run.min_time_s=0"] if args.steps else [])]
    folders = [results_folder(pipebench(["run", "--fresh", *common, *overrides])) for overrides in sources.values()]
    merged = args.work / "side-by-side"
    shutil.rmtree(merged, ignore_errors=True)
    pipebench(["report", *folders, "--out", str(merged)])
    rows = _figures([Path(folder) for folder in folders])
    table = markdown_table(rows, COLUMNS)
    print(table)
    _write(args, rows, table)
    print(f"figures: {args.work / 'formats.md'}, {args.work / 'formats.csv'}; the whole report: {merged / 'report.md'}")
    return 0


def _means(paths: Sequence[Path], value: str, stage: str = "") -> Dict[Tuple[str, int], float]:
    """Mean of column `value` by (dataset, workers) over the rows of the folders' CSVs (rows of `stage`
    only, when given); the dataset and workers are read from each job's row of summary.csv."""
    found: Dict[Tuple[str, int], List[float]] = {}
    for path in paths:
        with (path.parent / "summary.csv").open() as f:
            jobs = {row["job"]: (row["dataset"], int(row["workers"])) for row in csv.DictReader(f)}
        with path.open() as f:
            for row in csv.DictReader(f):
                if not stage or row["stage"] == stage:
                    found.setdefault(jobs[row["job"]], []).append(float(row[value]))
    return {key: sum(values) / len(values) for key, values in found.items()}


def _figures(folders: Sequence[Path]) -> List[Dict[str, object]]:
    """A row a (format, workers): samples/s and the load step (means over rounds) against the folder's at
    the same workers, and at workers=0 whether the format is within TOLERANCE of the folder."""
    rates = _means([folder / "summary.csv" for folder in folders], "samples_per_s")
    loads = _means([folder / "transforms.csv" for folder in folders], "ms_per_sample", "load")
    rows = []
    for (name, workers), rate in sorted(rates.items(), key=lambda item: (item[0][1], item[0][0] != FOLDER, item[0][0])):
        ratio = rate / rates[FOLDER, workers]
        rows.append({"format": name, "workers": workers, "samples_per_s": round(rate, 1), "x_image_folder": round(ratio, 3),
                     "load_ms_per_sample": round(loads[name, workers], 3),
                     "image_folder_load_ms_per_sample": round(loads[FOLDER, workers], 3),
                     "within_target": ("yes" if abs(ratio - 1) <= TOLERANCE else "no")
                     if workers == 0 and name != FOLDER else ""})
    return rows


def _write(args: argparse.Namespace, rows: Sequence[Mapping[str, object]], table: str) -> None:
    """The table with the machine and the settings named (WORK/formats.md), and its figures (WORK/formats.csv)."""
    machine = f"{cpu_model()}, {usable_cores()} usable cores"
    settings = (f"{args.images} images, shards of {args.shard_size}, transform={args.transform}, "
                f"rounds={args.rounds}, run.steps={args.steps or 'pipebench default'}")
    (args.work / "formats.md").write_text(
        f"# Formats side by side\n\n{machine}; {settings}. The target: at workers=0 each format within "
        f"{TOLERANCE:.0%} of image_folder's samples/s.\n\n{table}")
    with (args.work / "formats.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
