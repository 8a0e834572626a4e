"""Decode is charged to decode: a lazily opened image is decoded right after the load, timed as its
own `decode` row, with workers and without, and the transform that used to trigger it keeps only
its own cost."""

import dataclasses

import pytest
from conftest import QUICK_RUN, compose_spec
from decode_kit import SlowDecodeDataset
from known_cost_kit import known_cost
from PIL import Image

from pipebench.measure.job import measure_job
from pipebench.pipeline.stages import DECODE_STAGE
from pipebench.pipeline.timed_chain import InstrumentedDataset, undecoded

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it. The tests
# marked `beside` read the undecoded image, the rows' stages and the failing step, no rate: they share the cores.
pytestmark = pytest.mark.alone

BUSY = "pipebench.transforms.synthetic.BusyWait"
TO_TENSOR = "torchvision.transforms.PILToTensor"
DECODE_MS = 4.0
BUSY_MS = 1.0
# As tests/test_timing.py: CPU-time spinners measure tight from below, loose from above (preemption).
COST_TOLERANCE = 0.15
PREEMPTION_ALLOWANCE = 1.5


# The rows' medians are read over the quick run's 5 steps of 8 samples (40 a row): no minimum time
# stretches the window, and no consumer runs, since neither is read.
SHORT_WINDOW = ["run.min_time_s=0", "consumer=none"]


def _spec(tmp_path, workers, per_sample):
    spec = compose_spec([*QUICK_RUN, "run.profile_steps=0", *SHORT_WINDOW, f"workers={workers}"])
    dataset = {"_target_": "decode_kit.SlowDecodeDataset", "folder": str(tmp_path), "decode_ms": DECODE_MS}
    return dataclasses.replace(spec, dataset=dataset, per_sample=tuple(per_sample))


def _rows(record):
    return {(r["stage"], r["transform"]): r for r in record.transforms}


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@known_cost
def test_decode_has_its_own_line_and_the_first_transform_keeps_its_own_cost(tmp_path, workers):
    record = measure_job(_spec(tmp_path, workers, [{"_target_": BUSY, "ms": BUSY_MS}, {"_target_": TO_TENSOR}]),
                         tmp_path)
    rows = _rows(record)
    decode = rows[(DECODE_STAGE, "decode")]["ms_per_call_median"]
    busy = rows[("per_sample", "BusyWait")]["ms_per_call_median"]
    assert DECODE_MS * (1 - COST_TOLERANCE) <= decode <= DECODE_MS * PREEMPTION_ALLOWANCE
    assert BUSY_MS * (1 - COST_TOLERANCE) <= busy <= BUSY_MS * PREEMPTION_ALLOWANCE, "decode leaked into BusyWait"
    assert rows[("per_sample", "PILToTensor")]["ms_per_call_median"] < BUSY_MS


@known_cost
def test_decode_line_matches_the_decode_measured_apart(tmp_path):
    """A real JPEG: the decode row is the cost of `img.load()` timed on its own."""
    dataset = SlowDecodeDataset(str(tmp_path), decode_ms=DECODE_MS, length=8)
    wrapped = InstrumentedDataset(dataset, [lambda img: img.crop((0, 0, 8, 8))])
    sample, _, timings, *_ = wrapped[0]
    assert not undecoded(sample)
    assert timings[1] / 1e6 >= DECODE_MS * (1 - COST_TOLERANCE)
    assert timings[2] / 1e6 < DECODE_MS * (1 - COST_TOLERANCE), "the crop must not pay for the decode"


@pytest.mark.beside
def test_a_transform_that_decodes_by_itself_gets_the_undecoded_image(tmp_path):
    seen = []

    class DecodesItself:
        decodes_itself = True

        def __call__(self, img):
            seen.append(undecoded(img))
            img.load()
            return img

    dataset = SlowDecodeDataset(str(tmp_path), decode_ms=0.0, length=4)
    _, _, timings, *_ = InstrumentedDataset(dataset, [DecodesItself()])[0]
    assert seen == [True] and timings[1] == 0


@pytest.mark.beside
def test_no_decode_line_for_samples_that_need_none(tmp_path):
    spec = dataclasses.replace(compose_spec(["dataset=random_tensors", "dataset.shape=[3,32,32]", "dataset.length=512",
                                             *QUICK_RUN, "run.profile_steps=0", *SHORT_WINDOW]),
                               per_sample=({"_target_": BUSY, "ms": 0.2},))
    stages = {r["stage"] for r in measure_job(spec, tmp_path).transforms}
    assert DECODE_STAGE not in stages and "per_sample" in stages


@pytest.mark.beside
def test_a_corrupt_image_is_blamed_on_decode(tmp_path):
    whole = tmp_path / "ok.jpg"
    Image.effect_noise((256, 256), 60).convert("RGB").save(whole, quality=95)
    (tmp_path / "cut.jpg").write_bytes(whole.read_bytes()[:len(whole.read_bytes()) // 2])
    wrapped = InstrumentedDataset(_CutDataset(tmp_path / "cut.jpg"), [lambda img: img])
    failure = wrapped[0]
    assert failure.step == "decode"


class _CutDataset:
    def __init__(self, path):
        self.path = path

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return Image.open(self.path), 0
