"""Region decode on threads, run as a user runs it: crashes and nvImageCodec's `Broken promise` lines, counted.

Issue 55's target: 0 crashes and 0 `Broken promise` lines in 20 runs each of a region-decode chain under
`loader.backend=threads workers=2` and under `run.thread_profile=true` at workers=0 (the two ways its steps
ran on threads when the shared decoder crashed). Each run is a short `pipebench run` of the seed chain
with `RegionRandomCrop` in place of PILToTensor + RandomCrop.

    python benchmarks/region_threads.py             # 20 runs of each
    python benchmarks/region_threads.py --runs 3    # a look
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

PIPEBENCH = str(Path(sys.executable).with_name("pipebench"))
CHAIN = """\
# The seed chain with the region decode (only the crop's box decoded) and the fast mask.
per_sample:
  - _target_: pipebench.transforms.region.RegionRandomCrop
    size: 256
  - _target_: pipebench.transforms.mask.FastRandomMask
    ratio: 0.25
  - _target_: pipebench.transforms.color.ConvertColor
  - _target_: pipebench.transforms.color.Scale
per_batch: []
"""
MODES = {
    "threads": ["loader.backend=threads", "workers=2", "run.thread_profile=false"],
    "thread profile": ["workers=0", "run.thread_profile=true"],
}
SHORT_RUN = ["run=quick", "run.progress=false", "trace=none", "run.profile_steps=0", "loader.batch_size=16"]
# What nvImageCodec printed, many times a run, when two threads shared one decoder.
BROKEN = "Broken promise"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as work:
        conf = Path(work) / "conf" / "transform"
        conf.mkdir(parents=True)
        (conf / "region_fast.yaml").write_text(CHAIN)
        for mode, overrides in MODES.items():
            crashes = promises = 0
            for number in range(1, args.runs + 1):
                done = subprocess.run([PIPEBENCH, "run", "--config-dir", str(conf.parent), "transform=region_fast",
                                       *overrides, *SHORT_RUN, f"results_dir={work}/results"],
                                      capture_output=True, text=True, cwd=work)
                output = done.stdout + done.stderr
                promises += output.count(BROKEN)
                if done.returncode != 0:
                    crashes += 1
                    print(f"{mode} run {number}: exit {done.returncode}: {output.strip().splitlines()[-1:]}")
            print(f"{mode}: {args.runs} runs, {crashes} non-zero exits, {promises} '{BROKEN}' lines", flush=True)
            failed |= bool(crashes or promises)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
