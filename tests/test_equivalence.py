"""Equivalence verdicts, measured on real outputs: identical, close, same distribution, not equivalent, fails."""

import numpy as np
import torch
from PIL import Image

from pipebench.explore.equivalence import (
    ALPHA,
    CLOSE,
    FAILS,
    IDENTICAL,
    NOT_EQUIVALENT,
    SAME_DISTRIBUTION,
    TEST_NAME,
    check,
)
from pipebench.explore.variants import Chain, Variant, explore

TV = "torchvision.transforms"
# Small pictures keep the seed chain's checks fast; the crop still shrinks them.
PICTURE_HW = (48, 40)
CROP = 24


def _pictures(n):
    rng = np.random.default_rng(7)
    return [Image.fromarray(rng.integers(0, 256, (*PICTURE_HW, 3), dtype=np.uint8)) for _ in range(n)]


def _tensors(n):
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=generator) for _ in range(n)]


def _verdicts(name, chain, fetch):
    found = explore(name, chain)
    return {v.name: check(found.base.chain, v, fetch, seed=0) for v in found.variants[1:]}


def _nodes(*items):
    return tuple({"_target_": t, **kwargs} for t, kwargs in items)


def test_seed_chain_variants_come_out_identical():
    chain = Chain(_nodes((f"{TV}.PILToTensor", {}), (f"{TV}.RandomCrop", {"size": CROP}),
                         ("pipebench.transforms.mask.RandomMask", {"ratio": 0.25}),
                         ("pipebench.transforms.color.ConvertColor", {}), ("pipebench.transforms.color.Scale", {})))
    verdicts = _verdicts("seed", chain, _pictures)
    assert len(verdicts) == 7
    # Same seed: crop-first draws the same crop, the fast mask the same mask; bmm matches the matmul.
    assert {v.verdict for v in verdicts.values()} <= {IDENTICAL, CLOSE}
    assert verdicts["seed+crop_first"].verdict == IDENTICAL
    assert verdicts["seed+fast"].verdict == IDENTICAL
    assert all(v.equivalent and v.max_abs_diff is not None for v in verdicts.values())


def test_random_pointwise_step_behind_a_moved_crop_gives_the_same_distribution():
    chain = Chain(_nodes(("movable.AddNoise", {}), (f"{TV}.RandomCrop", {"size": 16})))
    verdict = _verdicts("noisy", chain, _tensors)["noisy+crop_first"]
    assert verdict.verdict == SAME_DISTRIBUTION, verdict.detail
    assert verdict.test == TEST_NAME and verdict.p_value >= ALPHA
    assert "outputs differ" in verdict.detail and "Kolmogorov-Smirnov" in verdict.detail


def test_per_batch_random_transform_is_never_passed_off_as_the_same():
    chain = Chain(_nodes(("movable.RandomGain", {}),))
    verdict = _verdicts("gain", chain, _tensors)["gain+per_batch"]
    assert verdict.verdict == NOT_EQUIVALENT and not verdict.equivalent
    assert "RandomGain makes one random draw per batch instead of one per sample" in verdict.detail


def test_false_declarations_are_caught():
    # SubtractMean claims to be pointwise; cropping first changes the mean it subtracts.
    deterministic = _verdicts("mean", Chain(_nodes(("movable.SubtractMean", {}), (f"{TV}.CenterCrop", {"size": 8}))),
                              _tensors)["mean+crop_first"]
    assert deterministic.verdict == NOT_EQUIVALENT and "outputs differ" in deterministic.detail
    # LoudNoise claims to be pointwise; its noise shrinks with the crop, and the KS test sees it.
    loud = _verdicts("loud", Chain(_nodes(("movable.LoudNoise", {}), (f"{TV}.RandomCrop", {"size": 8}))),
                     _tensors)["loud+crop_first"]
    assert loud.verdict == NOT_EQUIVALENT and loud.p_value < ALPHA


def test_a_variant_that_raises_fails():
    base = Chain(_nodes((f"{TV}.PILToTensor", {}), ("movable.TensorCrop", {"size": 8})))
    assert len(explore("tensor_crop", base).variants) == 1, "its declaration keeps the tensor-only crop in place"
    forced = Variant("forced", ("crop_first",), (), Chain(base.per_sample[::-1]))  # a PIL image cannot be sliced
    verdict = check(base, forced, _pictures, seed=0)
    assert verdict.verdict == FAILS and not verdict.equivalent
    assert verdict.detail.startswith("TypeError")
