"""The multi-rank tests' project: chains of known cost (a balanced one, one whose rank 1 is slower)
and faulty ones (rank 1 dies, rank 1 hangs), for test_distributed.py (alone) and
test_distributed_faults.py (beside)."""

import json
from pathlib import Path
from typing import Dict, List

TWO_RANKS = ["distributed.nproc=2", "results_dir=out"]
# 64 samples / 2 ranks / 8 a batch = 4 steps a rank per epoch: a quick run (a warm-up step and at
# least 5 more) spans a whole epoch and more.
SMALL = ["dataset=random_tensors", "dataset.shape=[3,32,32]", "dataset.length=64"]
# The straggler's extra CPU a sample on rank 1; x 8 samples = 32 ms a step against ~35 ms.
STRAGGLE_MS = 4.0


def write_rank_project(root: Path) -> Path:
    """`root` with faults.py and conf/transform/{balanced,straggler,dieonrank1,hangonrank1}.yaml."""
    (root / "faults.py").write_text(
        "import os, time\n\n"
        "class DieOnRank1:\n"
        "    def __call__(self, x):\n"
        "        if os.environ.get('RANK') == '1':\n"
        "            os._exit(3)\n"
        "        return x\n\n"
        "class HangOnRank1:\n"
        "    def __call__(self, x):\n"
        "        while os.environ.get('RANK') == '1':\n"
        "            time.sleep(1)\n"
        "        return x\n"
    )
    chains = root / "conf" / "transform"
    chains.mkdir(parents=True)
    busy = "  - _target_: pipebench.transforms.synthetic.BusyWait\n    ms: 0.2\n"
    (chains / "balanced.yaml").write_text(f"per_sample:\n{busy}")
    (chains / "straggler.yaml").write_text(
        f"per_sample:\n{busy}  - _target_: pipebench.transforms.synthetic.RankBusyWait\n"
        f"    ms: {STRAGGLE_MS}\n    rank: 1\n")
    for name in ("DieOnRank1", "HangOnRank1"):
        (chains / f"{name.lower()}.yaml").write_text(f"per_sample:\n  - _target_: faults.{name}\n")
    return root


def rank_results(folder: Path) -> List[Dict]:
    """Each job's result.json in a sweep folder, in job order."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("job-*/result.json"))]
