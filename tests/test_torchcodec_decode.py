"""The decoder moves decode with TorchCodec where it runs, else with torchvision's deprecated decoder.

TorchCodec's decode gives the pixels PIL gives, EXIF-oriented files included (TorchCodec turns them
upright; the turn is undone); without TorchCodec, or where it fails to load, torchvision's decoder
runs without its deprecation warning and explore's line says which ran and why. The CUDA test runs
only where there is a GPU."""

import importlib.util
import io
import warnings

import pytest
import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from cuda_marks import NEEDS_CUDA
from pipebench.base.extras import install_line
from pipebench.datasets.synthetic_jpeg import SyntheticJpegDataset
from pipebench.explore.chain import DECODER, Chain, SampleSource
from pipebench.explore.equivalence import DEFAULT_MAX_PIXEL_DIFF, IDENTICAL, NOT_EQUIVALENT, check
from pipebench.explore.variants import explore
from pipebench.transforms import decode
from pipebench.transforms.decode import (
    CODEC_EXTRA,
    DEPRECATION_TEXT,
    TORCHCODEC_NAME,
    TORCHVISION_NAME,
    BatchDecodeJpeg,
    DecodeJpeg,
    decoder_note,
    exif_orientation,
    torchcodec_problem,
)

NEEDS_TORCHCODEC = pytest.mark.skipif(importlib.util.find_spec("torchcodec") is None,
                                      reason="TorchCodec is not installed (the codec extra)")
TV = "torchvision.transforms"
PICTURE_HW = (48, 64)
# EXIF orientations 1-8, and 0 and 9, which are not orientations (nothing to undo).
ORIENTATIONS = range(10)


@pytest.fixture(autouse=True)
def fresh_probe():
    """Each test asks TorchCodec afresh (the answer is cached for the process)."""
    torchcodec_problem.cache_clear()
    yield
    torchcodec_problem.cache_clear()


@pytest.fixture
def synthetic_jpegs(tmp_path):
    dataset = SyntheticJpegDataset(length=16, num_images=4, width=PICTURE_HW[1], height=PICTURE_HW[0],
                                   cache_dir=tmp_path)
    return lambda n: [dataset[i % len(dataset)][0] for i in range(n)]


def _oriented(orientation, subsampling=2):
    """A noisy 40x24 JPEG whose EXIF block says `orientation`, with an ICC profile after it."""
    picture = Image.effect_noise((40, 24), 60).convert("RGB")
    exif = picture.getexif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    picture.save(buffer, "JPEG", exif=exif, quality=95, subsampling=subsampling, icc_profile=b"\0" * 600)
    return buffer.getvalue()


def _stored(data):
    """The pixels the file stores, as the chain's PILToTensor gives them."""
    return pil_to_tensor(Image.open(io.BytesIO(data)))


def _seed_chain():
    return Chain(({"_target_": f"{TV}.PILToTensor"}, {"_target_": f"{TV}.RandomCrop", "size": 32}))


def _decoder_variant(fetch):
    found = explore("seed", _seed_chain(), source=SampleSource.of(fetch(1)[0]))
    return found.base.chain, next(v for v in found.variants if v.moves == (DECODER,))


def _no_torchvision(*_args, **_kwargs):
    raise AssertionError("torchvision's decoder ran")


@NEEDS_TORCHCODEC
def test_the_decoder_runs_torchcodec_and_the_move_says_so(synthetic_jpegs, monkeypatch):
    monkeypatch.setattr(decode, "torchvision_rgb", _no_torchvision)
    assert decoder_note() == TORCHCODEC_NAME
    for image, same in zip(synthetic_jpegs(4), synthetic_jpegs(4)):
        assert torch.equal(DecodeJpeg()(image), pil_to_tensor(same))
    base, variant = _decoder_variant(synthetic_jpegs)
    assert variant.changes[0].endswith(f"straight to a uint8 tensor, with {TORCHCODEC_NAME})"), variant.changes
    assert check(base, variant, synthetic_jpegs, seed=0).verdict == IDENTICAL


@NEEDS_TORCHCODEC
@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_torchcodec_gives_the_stored_pixels_of_an_exif_oriented_file(orientation, monkeypatch):
    """TorchCodec turns the image upright; PIL's lazily opened image, which the chain converts, does not."""
    monkeypatch.setattr(decode, "torchvision_rgb", _no_torchvision)
    data = _oriented(orientation)
    assert exif_orientation(data) == orientation
    assert torch.equal(DecodeJpeg()(Image.open(io.BytesIO(data))), _stored(data))
    assert all(torch.equal(t, _stored(data)) for t in BatchDecodeJpeg("cpu")([data, data]))


@NEEDS_TORCHCODEC
def test_equivalence_catches_a_torchcodec_decode_that_differs(synthetic_jpegs, monkeypatch):
    real = decode.torchcodec_rgb
    monkeypatch.setattr(decode, "torchcodec_rgb", lambda data, device="cpu": [
        (t.to(torch.int16) - 40).clamp(0, 255).to(torch.uint8) for t in real(data, device)])
    verdict = check(*_decoder_variant(synthetic_jpegs), synthetic_jpegs, seed=0)
    assert verdict.verdict == NOT_EQUIVALENT, verdict.detail
    assert f"decoded pixels ({TORCHCODEC_NAME}): max |Δ| = 40 grey levels" in verdict.detail


def _uses_torchvision(fetch):
    """The decoder on `fetch`'s files: torchvision's pixels, no deprecation warning, and the note."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for image, same in zip(fetch(4), fetch(4)):
            assert torch.equal(DecodeJpeg()(image), pil_to_tensor(same))
        data = _oriented(6)
        assert torch.equal(BatchDecodeJpeg("cpu")([data])[0], _stored(data))
    assert not [w for w in caught if DEPRECATION_TEXT in str(w.message)], [str(w.message) for w in caught]
    return _decoder_variant(fetch)[1].changes[0]


def test_without_torchcodec_torchvisions_decoder_runs_quietly_and_the_move_says_why(synthetic_jpegs, monkeypatch):
    monkeypatch.setattr(decode, "TORCHCODEC", "torchcodec_not_installed")
    change = _uses_torchvision(synthetic_jpegs)
    install = install_line([CODEC_EXTRA])
    assert change.endswith(f"with {TORCHVISION_NAME}, as TorchCodec is not installed ({install}))"), change


@NEEDS_TORCHCODEC
def test_a_torchcodec_that_fails_to_load_leaves_torchvisions_decoder_with_the_reason(synthetic_jpegs, monkeypatch):
    monkeypatch.setattr(decode, "TORCHCODEC_DECODERS", "torchcodec.no_such_decoders")
    change = _uses_torchvision(synthetic_jpegs)
    assert f"with {TORCHVISION_NAME}, as TorchCodec " in change and "fails here: ModuleNotFoundError" in change


@NEEDS_TORCHCODEC
@NEEDS_CUDA
def test_torchcodec_decodes_a_batch_on_cuda_to_the_stored_pixels():
    """Not run without a GPU. nvJPEG's IDCT rounds otherwise than libjpeg-turbo's: 4:4:4 files (no chroma
    upsampling to differ in) are held to the equivalence check's default bound."""
    assert decoder_note("cuda") == TORCHCODEC_NAME
    files = [_oriented(orientation, subsampling=0) for orientation in range(1, 9)]
    decoded = BatchDecodeJpeg("cuda")(files)
    for data, image in zip(files, decoded):
        assert image.is_cuda and image.shape == _stored(data).shape
        assert int((image.cpu().to(torch.int16) - _stored(data).to(torch.int16)).abs().max()) <= DEFAULT_MAX_PIXEL_DIFF
