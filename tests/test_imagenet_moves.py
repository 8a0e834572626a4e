"""The ImageNet recipe's moves: torchvision v1 and v2 in the registry, the reduced-size decode with
its guard and its skip reasons, and the decode moves skipped on datasets that are not JPEG."""

import numpy as np
import pytest
import torch
import torchvision.transforms as v1
import torchvision.transforms.v2 as v2
from conftest import compose_spec
from PIL import Image

from pipebench.datasets.lazy_image import open_rgb
from pipebench.explore.equivalence import DEFAULT_MAX_PIXEL_DIFF, IDENTICAL, NOT_EQUIVALENT, check, close_within
from pipebench.explore.chain import REDUCED_DECODE, TENSOR_PATH, Chain, SampleSource
from pipebench.explore.chain_moves import fast
from pipebench.explore.decode_moves import DECODE_JPEG, reduced_decode, tensor_path
from pipebench.explore.variants import explore
from pipebench.pipeline.build import build_transforms
from pipebench.storage.file_reads import FileReads
from pipebench.pipeline.movement import TORCHVISION_MOVEMENT, declared_movement
from pipebench.pipeline.timed_chain import InstrumentedDataset, undecoded
from pipebench.transforms.decode import DecodeJpeg, torchvision_rgb
from pipebench.transforms.draft import DraftRandomResizedCrop, DraftRandomResizedCropV2, DraftResize

COMMON = ("RandomResizedCrop", "Resize", "CenterCrop", "RandomCrop", "RandomHorizontalFlip", "RandomVerticalFlip",
          "ColorJitter", "ToTensor", "PILToTensor", "ConvertImageDtype", "Normalize", "AutoAugment", "RandAugment",
          "TrivialAugmentWide", "AugMix")
JPEG_533x800 = SampleSource("JPEG", (533, 800))


def _chain(name):
    spec = compose_spec([f"transform={name}"])
    return Chain(spec.per_sample, spec.per_batch)


@pytest.fixture(scope="module")
def jpeg_files(tmp_path_factory):
    """Four noisy 533x800 JPEGs: detail at every scale, as a photo has."""
    folder = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    paths = []
    for k in range(4):
        smooth = Image.fromarray(rng.integers(0, 256, (8, 6, 3), dtype=np.uint8)).resize((533, 800), Image.BICUBIC)
        noisy = np.clip(np.asarray(smooth, np.int16) + rng.normal(0, 6, (800, 533, 3)), 0, 255).astype(np.uint8)
        path = folder / f"p{k}.jpg"
        Image.fromarray(noisy).save(path, quality=90)
        paths.append(path)
    return paths


@pytest.mark.parametrize("namespace", ["torchvision.transforms.", "torchvision.transforms.v2."])
@pytest.mark.parametrize("name", COMMON)
def test_common_transforms_are_declared_in_both_namespaces(namespace, name):
    node = {"_target_": namespace + name, "size": 224}
    assert declared_movement(node) is not None


def test_v2_only_transforms_and_opaque_augment_family():
    assert declared_movement({"_target_": "torchvision.transforms.v2.ToImage"}).returns == "tensor"
    assert declared_movement({"_target_": "torchvision.transforms.v2.ToDtype"}).batch_form == \
        "torchvision.transforms.v2.ToDtype"
    for name in ("AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix"):
        movement = declared_movement({"_target_": f"torchvision.transforms.v2.{name}"})
        assert movement.random and not (movement.pointwise or movement.crop or movement.batch_form)
    assert all(key.startswith("torchvision.transforms.") for key in TORCHVISION_MOVEMENT)


def test_normalize_batch_form_equals_per_sample_normalize_on_a_uint8_batch():
    """Normalize after the dtype conversion, per sample or once on the collated uint8 batch: the same."""
    batch = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    norm, cast = v1.Normalize([0.4, 0.5, 0.6], [0.2, 0.3, 0.25]), v1.ConvertImageDtype(torch.float32)
    per_sample = torch.stack([norm(cast(x)) for x in batch])
    assert torch.equal(norm(cast(batch)), per_sample)
    v2_cast, v2_norm = v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.4, 0.5, 0.6], [0.2, 0.3, 0.25])
    assert torch.equal(v2_norm(v2_cast(batch)), torch.stack([v2_norm(v2_cast(x)) for x in batch]))


def test_both_recipes_get_the_same_moves():
    one = explore("imagenet", _chain("imagenet"), source=JPEG_533x800)
    two = explore("v2", _chain("imagenet_v2"), source=JPEG_533x800)
    assert [v.moves for v in one.variants] == [v.moves for v in two.variants]
    assert (REDUCED_DECODE,) in [v.moves for v in one.variants]
    drafted = reduced_decode(_chain("imagenet_v2")).chain.per_sample[0]["_target_"]
    assert drafted.endswith("DraftRandomResizedCropV2")


def test_v2_per_batch_keeps_the_batch_uint8_across_the_worker_boundary():
    moved = next(v for v in explore("v2", _chain("imagenet_v2"), source=JPEG_533x800).variants if v.moves == ("per_batch",))
    assert [n["_target_"].rsplit(".", 1)[1] for n in moved.chain.per_sample][-1] == "ToImage"
    assert [n["_target_"].rsplit(".", 1)[1] for n in moved.chain.per_batch] == ["ToDtype", "Normalize"]


@pytest.mark.parametrize("source, reason", [
    (SampleSource("PNG", (533, 800)), "the dataset gives PNG samples, not JPEG files: decode moves skipped"),
    (SampleSource("tensor"), "the dataset gives tensor samples, not JPEG files"),
    (SampleSource("JPEG", (300, 400)), "would go below RandomResizedCrop's output size 224x224"),
])
def test_decode_moves_are_skipped_with_one_line_when_they_cannot_serve(source, reason):
    found = explore("imagenet", _chain("imagenet"), source=source)
    assert all(REDUCED_DECODE not in v.moves for v in found.variants)
    lines = [r for r in found.not_applied if r.startswith(REDUCED_DECODE)]
    assert len(lines) == 1 and reason in lines[0] and "\n" not in lines[0]


@pytest.mark.parametrize("first, reason", [
    ({"_target_": "torchvision.transforms.Resize", "size": 1024}, "upsamples the 533x800 images"),
    ({"_target_": "torchvision.transforms.Resize", "size": 400}, "would go below Resize's output size"),
    ({"_target_": "torchvision.transforms.RandomCrop", "size": 224, "padding": 4}, "pads"),
    ({"_target_": "torchvision.transforms.CenterCrop", "size": 224}, "does not resize the image down"),
    ({"_target_": "movable.Undeclared"}, "does not resize the image down"),
])
def test_an_unsafe_first_step_is_not_drafted_and_the_reason_names_it(first, reason):
    moved = reduced_decode(Chain((first, {"_target_": "torchvision.transforms.PILToTensor"})), JPEG_533x800)
    assert not moved.changes and reason in moved.reason


@pytest.mark.parametrize("base, drafted", [(v1.RandomResizedCrop(224), DraftRandomResizedCrop(224)),
                                           (v2.RandomResizedCrop(224), DraftRandomResizedCropV2(224))])
def test_the_drafted_crop_draws_the_same_crop_and_never_goes_below_its_output(jpeg_files, base, drafted):
    for k, path in enumerate(jpeg_files * 4):
        torch.manual_seed(k)
        ours = base(Image.open(path))
        torch.manual_seed(k)
        lazy = Image.open(path)
        theirs = drafted(lazy)
        assert theirs.size == ours.size == (224, 224)
        assert lazy.size[0] * 2 >= 533 and not undecoded(lazy)  # never decoded below 1/2 of 533x800
        assert torch.rand(1).item() == (torch.manual_seed(k), base.get_params(Image.open(path), base.scale, base.ratio),
                                        torch.rand(1).item())[2], "same RNG draws as the original"


def test_drafted_resize_decodes_at_half_size_and_stays_close(jpeg_files):
    lazy = Image.open(jpeg_files[0])
    out = DraftResize(256)(lazy)
    assert lazy.size == (267, 400), "decoded at 1/2 (libjpeg rounds up)"
    full = np.asarray(v1.Resize(256)(Image.open(jpeg_files[0])), np.int16)
    assert out.size == (256, 384) and np.abs(np.asarray(out, np.int16) - full).mean() < 3


def test_reduced_decode_verdict_is_close_with_the_largest_difference_and_respects_the_bound(jpeg_files):
    base = _chain("imagenet")
    variant = next(v for v in explore("imagenet", base, source=JPEG_533x800).variants if v.moves == (REDUCED_DECODE,))
    fetch = _fetcher(jpeg_files)
    verdict = check(base, variant, fetch, seed=0, max_pixel_diff=255)
    assert verdict.verdict == close_within(int(verdict.max_abs_diff)) and verdict.max_abs_diff > 0
    assert f"max |Δ| = {int(verdict.max_abs_diff)} grey levels after the resize" in verdict.detail
    tight = check(base, variant, fetch, seed=0, max_pixel_diff=int(verdict.max_abs_diff) - 1)
    assert tight.verdict == NOT_EQUIVALENT and "above the bound" in tight.detail


def test_tensor_path_decodes_to_uint8_and_runs_the_pil_steps_as_v2_tensor_forms():
    for name, conversion in (("imagenet", ["ToFloat", "Normalize"]), ("imagenet_v2", ["ToImage", "ToDtype", "Normalize"])):
        moved = tensor_path(_chain(name), JPEG_533x800)
        targets = [n["_target_"] for n in moved.chain.per_sample]
        assert targets[:3] == [DECODE_JPEG, "torchvision.transforms.v2.RandomResizedCrop",
                               "torchvision.transforms.v2.RandomHorizontalFlip"]
        assert [t.rsplit(".", 1)[1] for t in targets[3:]] == conversion
        assert moved.chain.per_sample[1]["size"] == 224, "arguments travel"
    blocked = tensor_path(Chain(({"_target_": "movable.Undeclared"}, {"_target_": "torchvision.transforms.PILToTensor"})))
    assert "Undeclared runs on the PIL image before PILToTensor and declares no tensor form" in blocked.reason
    assert "decode moves skipped" in tensor_path(_chain("imagenet"), SampleSource("PNG", (533, 800))).reason


def test_tensor_path_is_close_with_the_largest_difference(jpeg_files):
    base = _chain("imagenet")
    variant = next(v for v in explore("imagenet", base, source=JPEG_533x800).variants if v.moves == (TENSOR_PATH,))
    fetch = _fetcher(jpeg_files)
    verdict = check(base, variant, fetch, seed=0)  # the default bound: what two JPEG decoders differ by
    assert verdict.max_abs_diff <= DEFAULT_MAX_PIXEL_DIFF, verdict.detail
    assert verdict.verdict in (close_within(int(verdict.max_abs_diff)), IDENTICAL), verdict.detail


def test_the_decoder_is_left_the_undecoded_file(jpeg_files):
    wrapped = InstrumentedDataset(_Files(jpeg_files), [DecodeJpeg()])
    sample, _, timings, *_ = wrapped[0]
    assert sample.dtype == torch.uint8 and sample.shape == (3, 800, 533) and timings[1] == 0


def test_the_decoder_reuses_the_bytes_the_load_read_and_leaves_pil_undecoded(jpeg_files):
    # A dataset reading through FileReads opens the image from memory (no filename): the decoder
    # must decode those bytes itself, not fall back to PIL, and read the file no second time.
    reads = FileReads()
    lazy = open_rgb(jpeg_files[0], reads)
    decoded = DecodeJpeg()(lazy)
    assert undecoded(lazy), "PIL did not decode it"
    assert reads.counts()[2] == 1  # files read: once, by the load
    with open(jpeg_files[0], "rb") as handle:
        expected = torchvision_rgb([handle.read()])[0]  # libjpeg-turbo's pixels, without its deprecation warning
    assert torch.equal(decoded, expected)


@pytest.mark.parametrize("cast, normalize", [
    ({"_target_": "torchvision.transforms.ToTensor"}, "torchvision.transforms.Normalize"),
    ({"_target_": "torchvision.transforms.v2.ToDtype", "dtype": {"_target_": "hydra.utils.get_object",
                                                                "path": "torch.float32"}, "scale": True},
     "torchvision.transforms.v2.Normalize"),
])
def test_cast_and_normalize_fuse_into_one_multiply_add_within_float_rounding(cast, normalize):
    norm = {"_target_": normalize, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    fused = fast(Chain(({"_target_": "torchvision.transforms.PILToTensor"} if "v2" in normalize else cast,
                        *([cast] if "v2" in normalize else []), norm)))
    assert fused.chain.per_sample[-1]["_target_"] == "pipebench.transforms.cast.NormalizeUint8"
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (20, 30, 3), dtype=np.uint8))
    ours = build_transforms([cast, norm] if "v2" not in normalize else
                            [{"_target_": "torchvision.transforms.PILToTensor"}, cast, norm], "t")
    theirs = build_transforms(fused.chain.per_sample, "t")
    a, b = image, image
    for step in ours:
        a = step(a)
    for step in theirs:
        b = step(b)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    unscaled = dict(cast, scale=False) if "v2" in normalize else None
    if unscaled:
        assert fast(Chain((unscaled, norm))).changes == (), "ToDtype without scale is not a [0, 1] cast"


def _fetcher(paths):
    """explore's `fetch(n)`: the first n files, freshly opened (as plan_exploration fetches)."""
    return lambda n: [Image.open(paths[i % len(paths)]) for i in range(n)]


class _Files:
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        return Image.open(self.paths[index]), 0
