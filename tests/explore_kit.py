"""The explore tests' small project: three chains over tiny tensors or JPEGs, and the streaming
dataset's overrides (test_explore.py measures, alone; test_explore_cli.py runs the command beside)."""

from pathlib import Path

# Scale is pointwise, so the crop may move ahead of it; the trailing BusyWait has no per-batch
# form, so nothing moves into the collate. Two chains x two rounds: four quick jobs.
CHAIN = ("per_sample:\n"
         "  - _target_: pipebench.transforms.color.Scale\n"
         "  - _target_: torchvision.transforms.RandomCrop\n"
         "    size: 16\n"
         "  - _target_: pipebench.transforms.synthetic.BusyWait\n"
         "    ms: 0\n"
         "per_batch: []\n")
# The built-in iterable dataset over tiny tensors.
STREAM = ["dataset=sharded_stream", "dataset.source.shape=[3,32,32]", "dataset.source.length=512"]


def write_chain_project(root: Path) -> Path:
    """`root` with conf/transform/{scaled,cropped,decoded}.yaml: a chain with a move, one with a
    crop alone, and one that decodes."""
    folder = root / "conf" / "transform"
    folder.mkdir(parents=True)
    (folder / "scaled.yaml").write_text(CHAIN)
    (folder / "cropped.yaml").write_text("per_sample:\n  - _target_: torchvision.transforms.CenterCrop\n"
                                         "    size: 16\nper_batch: []\n")
    (folder / "decoded.yaml").write_text("per_sample:\n  - _target_: torchvision.transforms.PILToTensor\n"
                                         "  - _target_: torchvision.transforms.RandomCrop\n    size: 16\n"
                                         "  - _target_: pipebench.transforms.color.Scale\nper_batch: []\n")
    return root
