"""The storage check's workloads: DLIO's emulated accelerator step, batch and sample sizes for each.

Each figure is copied from DLIO's workload configs (github.com/argonne-lcf/dlio_benchmark at
e1919d7b6ccffbe15143cd616517da9e5d7b26a7, `dlio_benchmark/configs/workload/<name>.yaml`), the
file named in the comment beside it: `train.computation_time` is the step, `reader.batch_size` the
batch, `dataset.record_length_bytes` (and `_stdev`) a sample's size on storage,
`record_length_bytes_resize` what reaches the model, `num_files_train` x `num_samples_per_file`
the dataset, `reader.read_threads` the loader's workers and `metric.au` the minimum AU.

They live here, as data of the track, rather than as a Hydra config group: no job composes them;
the verb turns one into the overrides of its jobs (`Preset.overrides`).
"""

from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from pipebench.base.errors import ConfigError

__all__ = ["CUSTOM", "DEFAULT_MIN_AU_PCT", "Preset", "WORKLOADS", "Workload", "custom_preset", "preset", "workload_listing"]

CUSTOM = "custom"
# workload=custom's minimum AU unless storage_check.min_au_pct says otherwise: ResNet-50's and U-Net's.
DEFAULT_MIN_AU_PCT = 90.0
MS_PER_S = 1000.0


@dataclass(frozen=True)
class Step:
    """One accelerator's emulated step for a workload: seconds a batch, and the batch."""

    step_s: float
    batch_size: int


@dataclass(frozen=True)
class Workload:
    name: str
    min_au_pct: float
    sample_bytes: int
    sample_bytes_stdev: int
    handed_bytes: int
    # Whether a chain gets a JPEG to decode (ImageNet's images); else the sample's resized tensor.
    images: bool
    dataset_length: int
    workers: int
    steps: Mapping[str, Step]


WORKLOADS: Mapping[str, Workload] = {
    "resnet50": Workload(
        "resnet50", min_au_pct=90.0,  # metric.au: 0.90
        sample_bytes=114660,  # record_length_bytes: 114660.07
        sample_bytes_stdev=0,
        handed_bytes=150528,  # record_length_bytes_resize: 150528 (224 x 224 x 3)
        images=True,
        dataset_length=1024 * 1251,  # num_files_train: 1024, num_samples_per_file: 1251
        workers=8,  # read_threads: 8
        steps={
            "h100": Step(0.224, 400),  # resnet50_h100.yaml: computation_time 0.224, batch_size 400
            "a100": Step(0.435, 400),  # resnet50_a100.yaml: computation_time 0.435, batch_size 400
        }),
    "unet3d": Workload(
        "unet3d", min_au_pct=90.0,  # metric.au: 0.90
        sample_bytes=146600628,  # record_length_bytes: 146600628
        sample_bytes_stdev=68341808,  # record_length_bytes_stdev: 68341808
        handed_bytes=2097152,  # record_length_bytes_resize: 2097152
        images=False,
        dataset_length=168,  # num_files_train: 168, num_samples_per_file: 1
        workers=4,  # read_threads: 4
        steps={
            "h100": Step(0.323, 7),  # unet3d_h100.yaml: computation_time 0.323, batch_size 7
            "a100": Step(0.636, 7),  # unet3d_a100.yaml: computation_time 0.636, batch_size 7
        }),
    "cosmoflow": Workload(
        "cosmoflow", min_au_pct=70.0,  # metric.au: 0.70
        sample_bytes=2828486,  # record_length_bytes: 2828486
        sample_bytes_stdev=71311,  # record_length_bytes_stdev: 71311
        handed_bytes=2828486,  # no resize given: the sample itself
        images=False,
        dataset_length=524288,  # num_files_train: 524288, num_samples_per_file: 1
        workers=4,  # read_threads: 4
        steps={
            "h100": Step(0.00350, 1),  # cosmoflow_h100.yaml: computation_time 0.00350, batch_size 1
            "a100": Step(0.00551, 1),  # cosmoflow_a100.yaml: computation_time 0.00551, batch_size 1
        }),
}


@dataclass(frozen=True)
class Preset:
    """What one storage check emulates: the accelerator's step and batch, the minimum AU, and, for a
    workload's preset, its generated dataset (None: workload=custom, the user's own dataset)."""

    workload: str
    accelerator: str
    step_ms: float
    batch_size: int
    min_au_pct: float
    dataset: Optional[Workload]

    def overrides(self, user: Tuple[str, ...]) -> Tuple[str, ...]:
        """The jobs' overrides before the user's own (theirs win): the emulated accelerator and, for a
        workload, its dataset, chain none and the workload's reader threads. A chain the user names gets
        images to decode where the workload has them."""
        consumer = ("consumer=emulated", f"consumer.step_ms={self.step_ms:g}", f"loader.batch_size={self.batch_size}")
        if self.dataset is None:
            return consumer
        data = self.dataset
        chain = next((o.split("=", 1)[1] for o in user if o.startswith("transform=")), "none")
        images = data.images and chain != "none"
        return (*consumer, "dataset=storage_samples", f"dataset.sample_bytes={data.sample_bytes}",
                f"dataset.sample_bytes_stdev={data.sample_bytes_stdev}",
                f"dataset.handed_bytes={data.handed_bytes}", f"dataset.images={str(images).lower()}",
                "transform=none", f"workers={data.workers}")


def workload_listing() -> str:
    """Every workload with its accelerators, and custom: what the errors and the help list."""
    return "; ".join(f"{w.name} ({', '.join(w.steps)})" for w in WORKLOADS.values()) + f"; {CUSTOM}"


def preset(workload: Optional[str], accelerator: Optional[str]) -> Preset:
    """The preset of `workload` on `accelerator`; a ConfigError listing what exists for any other."""
    known = WORKLOADS.get(workload or "")
    if known is None:
        raise ConfigError(f"storage-check: no workload {workload!r}; workloads (accelerators): {workload_listing()}")
    step = known.steps.get(accelerator or "")
    if step is None:
        raise ConfigError(f"storage-check: workload={workload} has no preset for accelerator {accelerator!r}; "
                          f"it has {', '.join(known.steps)} (workloads: {workload_listing()})")
    return Preset(known.name, str(accelerator), step.step_s * MS_PER_S, step.batch_size, known.min_au_pct, known)


def custom_preset(step_ms: float, batch_size: int, min_au_pct: float = DEFAULT_MIN_AU_PCT) -> Preset:
    """workload=custom: the step and batch of the user's consumer.step_ms and loader.batch_size."""
    return Preset(CUSTOM, CUSTOM, step_ms, batch_size, min_au_pct, None)
