"""Does a variant compute what the base chain computes? Measured on real samples, never assumed.

Same seed first: equal outputs are `identical`, equal within float tolerance `close`. Otherwise a
chain that is (or may be) random gets a Kolmogorov-Smirnov test on per-sample statistics across
many seeds; a random step moved into the collate (one draw a batch) is always `not equivalent`.
A decode move may change pixels a little by design: its decoded pixels are compared alone, within
`--max-pixel-diff` grey levels, and the rest of the variant against the base chain with the same
move applied, so a grey level of decode difference is not mistaken for a change downstream.
docs/explore.md gives each verdict in full. On-device steps run on the CPU here, but for a step
that names its device; outputs are compared on the CPU.
"""

from dataclasses import dataclass, fields
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import default_collate

from pipebench.explore.chain import (
    DECODE_MOVES,
    DECODER,
    GPU_DECODER,
    REGION_DECODE,
    TENSOR_PATH,
    Chain,
    StepArguments,
    Variant,
    class_name,
    target,
)
from pipebench.explore.decode_moves import (
    BATCH_DECODE_JPEG,
    CUDA,
    DECODE_JPEG,
    READ_JPEG_BYTES,
    decoder,
    decoder_conversion,
    pixel_prefixes,
)
from pipebench.explore.variants import move_functions
from pipebench.measure.setup import seed_everything
from pipebench.pipeline.build import build_transforms
from pipebench.pipeline.movement import declared_movement
from pipebench.pipeline.timed_chain import first_line
from pipebench.transforms.decode import decoder_note

IDENTICAL = "identical"
CLOSE = "close"
SAME_DISTRIBUTION = "same distribution"
NOT_EQUIVALENT = "not equivalent"
FAILS = "fails"
EQUIVALENT_VERDICTS = (IDENTICAL, CLOSE, SAME_DISTRIBUTION)
# Files decoded both ways for the decoder's pixel check.
DECODER_SAMPLES = 8
# The moves that swap the chain's PIL->tensor conversion for a decoder: judged by decoder_difference.
DECODER_MOVES = (DECODER, GPU_DECODER)


def close_within(max_abs: int) -> str:
    """The verdict of a decoder that differs by at most `max_abs` grey levels."""
    return f"{CLOSE} (max |Δ| = {max_abs})"


def is_equivalent(verdict: str) -> bool:
    """True for the verdicts a winner may have (`close (max |Δ| = k)` included)."""
    return verdict in EQUIVALENT_VERDICTS or verdict.startswith(f"{CLOSE} (")


# Same-seed check: this many batches, each under its own seed, of BATCH_SIZE samples (enough
# to exercise the collate and per-batch steps; a mismatch shows on the first pixel it touches).
SAME_SEED_BATCHES = 3
BATCH_SIZE = 4
# float32 carries ~7 significant digits; a reordered sum (per-sample matmul vs one bmm) on
# pixel values up to 255 differs by ~1e-5. Both tolerances sit well above that and far below
# one grey level (1/255 after Scale).
RTOL = 1e-5
ATOL = 1e-4
# Distribution test: seeds per chain (independent: the variant's seeds follow the base's), so
# SEEDS x BATCH_SIZE per-sample statistics a side. At 400 a side the KS test detects a shift of
# about 0.12 standard deviations at alpha.
DISTRIBUTION_SEEDS = 100
# Family-wise: the smallest p over the statistics, Bonferroni-corrected, must reach ALPHA to
# call a difference. 0.01 keeps a false "not equivalent" rare across a dozen variants.
ALPHA = 0.01
STATISTICS = ("mean", "std")
# The default bound on a decode move's largest pixel difference, in grey levels. Two JPEG decoders
# that upsample chroma alike differ by at most a few grey levels (their IDCTs' rounding), so the
# decoder and the tensor path (max 1 on the default corpus) are `close` within it. torchvision's
# nvJPEG decode (gpu_decoder on CUDA) upsamples 4:2:0 chroma nearest-neighbour where libjpeg-turbo
# interpolates: on the H100 host 57 levels from PIL on the synthetic JPEGs, 129 at flat-colour edges,
# 0 on 4:4:4 files; so it is not, and its verdict says why (GPU_DECODER_CHROMA). TorchCodec's CUDA
# decode goes through nvJPEG's batched decode too. A reduced-size decode is a different low-pass
# filter from the resize's and differs by up to ~54 levels at sharp, grainy edges on the default
# corpus (measured): beyond this bound by design, so the user who accepts that raises it
# (--max-pixel-diff 64).
DEFAULT_MAX_PIXEL_DIFF = 4
# Why gpu_decoder on a GPU can exceed the bound on 4:2:0 JPEGs (nearly every photo), and the ways out.
GPU_DECODER_CHROMA = ("nvJPEG's batched decode (TorchCodec's or torchvision's) upsamples 4:2:0 chroma "
                      "nearest-neighbour where PIL interpolates, so colour edges differ; gpu_region_decode "
                      "(nvImageCodec, interpolating) keeps PIL's pixels, or --max-pixel-diff accepts the difference")
# Random steps that give the same pixels on a PIL image and on a tensor (they move or crop pixels,
# or resize, which the pixel bound is for): a decode move that carries them stays judged by the bound.
EXACT_ON_TENSORS = ("RandomHorizontalFlip", "RandomVerticalFlip", "RandomCrop", "RandomResizedCrop")
# Files a reduced-size decode or the tensor path is compared on, each under its own seed.
PIXEL_SAMPLES = 16
TEST_NAME = "two-sample Kolmogorov-Smirnov (scipy.stats.ks_2samp)"

Fetch = Callable[[int], List[Any]]


@dataclass(frozen=True)
class Equivalence:
    verdict: str
    detail: str
    # Set when the distribution test ran: its name and Bonferroni-corrected p.
    test: str = ""
    p_value: Optional[float] = None
    max_abs_diff: Optional[float] = None

    @property
    def equivalent(self) -> bool:
        return is_equivalent(self.verdict)


@dataclass(frozen=True)
class _Built:
    per_sample: Tuple[Callable, ...]
    per_batch: Tuple[Callable, ...]
    on_device: Tuple[Callable, ...] = ()

    @classmethod
    def of(cls, chain: Chain) -> "_Built":
        return cls(*(tuple(build_transforms(getattr(chain, f.name), f"transform.{f.name}"))
                     for f in fields(Chain)))

    def __call__(self, inputs: Sequence[Any], seed: int) -> torch.Tensor:
        """One batch, as the loader makes it: per-sample steps, default_collate, per-batch steps."""
        seed_everything(seed)
        samples = []
        for sample in inputs:
            for step in self.per_sample:
                sample = step(sample)
            samples.append(sample)
        batch = default_collate(samples)
        for step in (*self.per_batch, *self.on_device):
            batch = step(batch)
        return batch.cpu() if isinstance(batch, torch.Tensor) else batch  # a step may name its device


def _may_be_random(chain: Chain) -> bool:
    movements = [declared_movement(n) for n in (*chain.per_sample, *chain.per_batch, *chain.on_device)]
    return any(m is None or m.random for m in movements)


def _compare(base: torch.Tensor, other: torch.Tensor) -> Tuple[str, Optional[float]]:
    """(IDENTICAL / CLOSE / a reason they differ, max |diff| where shapes agree)."""
    if base.shape != other.shape:
        return f"shape {tuple(other.shape)} instead of {tuple(base.shape)}", None
    if base.dtype != other.dtype:
        return f"dtype {other.dtype} instead of {base.dtype}", None
    if torch.equal(base, other):
        return IDENTICAL, 0.0
    diff = float((base.double() - other.double()).abs().max())
    if torch.allclose(base.double(), other.double(), rtol=RTOL, atol=ATOL):
        return CLOSE, diff
    return f"outputs differ (max |diff| {diff:.3g})", diff


def _statistics(batch: torch.Tensor) -> np.ndarray:
    """[samples, STATISTICS]: each output sample's mean and standard deviation."""
    flat = batch.reshape(batch.shape[0], -1).double()
    return torch.stack([flat.mean(dim=1), flat.std(dim=1)], dim=1).numpy()


def _distribution_test(base: _Built, variant: _Built, fetch: Fetch, seed: int) -> Tuple[float, str]:
    """Bonferroni-corrected p that per-sample statistics come from one distribution, and a note."""
    # Imported here: scipy.stats costs every CLI start about a second, and only explore uses it.
    from scipy.stats import ks_2samp

    ours = np.concatenate([_statistics(base(fetch(BATCH_SIZE), seed + s)) for s in range(DISTRIBUTION_SEEDS)])
    theirs = np.concatenate([_statistics(variant(fetch(BATCH_SIZE), seed + DISTRIBUTION_SEEDS + s))
                             for s in range(DISTRIBUTION_SEEDS)])
    pvalues = [float(ks_2samp(ours[:, k], theirs[:, k]).pvalue) for k in range(len(STATISTICS))]
    p = min(1.0, len(pvalues) * min(pvalues))
    note = (f"{TEST_NAME} on per-sample {' and '.join(STATISTICS)}, {DISTRIBUTION_SEEDS} seeds x "
            f"{BATCH_SIZE} samples a side: p={p:.3g} (Bonferroni over {len(pvalues)}; alpha {ALPHA})")
    return p, note


def _as_pixels(image: Any) -> np.ndarray:
    """An 8-bit image (PIL, or a uint8 [C, H, W] tensor) as an int16 [H, W, C] array."""
    if isinstance(image, torch.Tensor):
        return image.permute(1, 2, 0).numpy().astype(np.int16)
    return np.asarray(image, dtype=np.int16)


def pixel_difference(base_chain: Chain, moved: Chain, lengths: Tuple[int, int], fetch: Fetch, seed: int) -> int:
    """The largest |Δ| in grey levels between the leading steps of the two chains (`lengths` of each),
    same files and seeds."""
    ours = build_transforms(base_chain.per_sample[:lengths[0]], "transform.per_sample")
    theirs = build_transforms(moved.per_sample[:lengths[1]], "transform.per_sample")
    worst = 0
    for k in range(PIXEL_SAMPLES):
        images = []
        for steps in (ours, theirs):
            seed_everything(seed + k)
            image = fetch(1)[0]
            for step in steps:
                image = step(image)
            images.append(_as_pixels(image))
        a, b = images
        if a.shape != b.shape:
            raise ValueError(f"the moved steps give shape {b.shape} instead of {a.shape}")
        worst = max(worst, int(np.abs(a - b).max()))
    return worst


def _decoder_under_test(move: str, base_chain: Chain, variant: Variant) -> Tuple[Callable[[Any], torch.Tensor], str]:
    """(what turns one image into a uint8 tensor in place of the chain's conversion, which decoder that
    is): the decoder move's DecodeJpeg, or the variant's own batched decode (on the device it names)."""
    if move == DECODER:
        node = decoder(base_chain).chain.per_sample[0]
        which = decoder_note() if target(node) == DECODE_JPEG else class_name(target(node))
        return build_transforms([node], "transform.per_sample")[0], which
    batched = next(n for n in variant.chain.on_device if target(n) == BATCH_DECODE_JPEG)
    read, decode = build_transforms([{"_target_": READ_JPEG_BYTES}, batched], "transform.on_device")

    def one_image(image: Any) -> torch.Tensor:  # its file's bytes as a batch of one, back on the CPU
        return decode([read(image)])[0].cpu()
    return one_image, decoder_note(decode.device)


def decoder_difference(base_chain: Chain, decode: Callable[[Any], torch.Tensor], fetch: Fetch,
                       which: str) -> Tuple[int, str]:
    """(largest |Δ| in grey levels, a note naming `which` decoder) between the chain's PIL->tensor
    conversion and `decode`, on DECODER_SAMPLES files. Raises what the decoder raises. Each side gets
    its own image objects: PIL drops a file's bytes once it has decoded it, and a decoder given a
    decoded image falls back to reading its pixels, which would compare PIL with itself."""
    node = base_chain.per_sample[decoder_conversion(base_chain)]
    conversion = build_transforms([node], "transform.per_sample")[0]
    worst = 0
    for image, same_file in zip(fetch(DECODER_SAMPLES), fetch(DECODER_SAMPLES)):
        ours, theirs = conversion(image), decode(same_file)
        if ours.shape != theirs.shape:
            raise ValueError(f"the decoder gives shape {tuple(theirs.shape)} instead of {tuple(ours.shape)}")
        worst = max(worst, int((ours.to(torch.int16) - theirs.to(torch.int16)).abs().max()))
    return worst, f"decoded pixels ({which}): max |Δ| = {worst} grey levels over {DECODER_SAMPLES} files"


def _decoded_difference(move: str, base_chain: Chain, variant: Variant, fetch: Fetch, seed: int
                        ) -> Tuple[int, str, Chain]:
    """(largest |Δ| in grey levels, a note, the base chain with the move applied) for a decode move
    (gpu_decoder: with the decoder move, which decodes the same way one image at a time)."""
    if move in DECODER_MOVES:
        decode, which = _decoder_under_test(move, base_chain, variant)
        worst, note = decoder_difference(base_chain, decode, fetch, which)
        return worst, note, decoder(base_chain).chain
    moved = move_functions(None)[move](base_chain).chain
    worst = pixel_difference(base_chain, moved, pixel_prefixes(move, base_chain), fetch, seed)
    where = "in the decoded region" if move == REGION_DECODE else "after the resize"
    return worst, f"{move}: max |Δ| = {worst} grey levels {where} over {PIXEL_SAMPLES} files", moved


def _random_pixels_moved(move: str, base_chain: Chain) -> bool:
    """The move carried a random step that changes pixel values (ColorJitter, the auto-augment family,
    a blur) from the PIL image to its tensor form: the two forms round differently under one draw."""
    if move not in (TENSOR_PATH, REGION_DECODE):
        return False
    steps = base_chain.per_sample[:pixel_prefixes(move, base_chain)[0]]
    return any(m is not None and m.random and m.tensor_form and class_name(target(n)) not in EXACT_ON_TENSORS
               for n, m in ((n, declared_movement(n)) for n in steps))


def check(base_chain: Chain, variant: Variant, fetch: Fetch, seed: int,
          max_pixel_diff: int = DEFAULT_MAX_PIXEL_DIFF) -> Equivalence:
    """The variant's verdict against the base chain; `fetch(n)` returns n fresh input samples.
    A decode move's pixel difference must stay within `max_pixel_diff` grey levels."""
    move = next((m for m in variant.moves if m in DECODER_MOVES or m in DECODE_MOVES), None)
    if move is None:
        return _check_chain(base_chain, variant, fetch, seed)
    try:
        worst, note, moved = _decoded_difference(move, base_chain, variant, fetch, seed)
    except Exception as exc:  # a decoder may fail on the user's files; the verdict says how
        return Equivalence(FAILS, f"{move}: {first_line(exc)}")
    note += f" (bound {max_pixel_diff}, --max-pixel-diff)"
    if worst > max_pixel_diff and _random_pixels_moved(move, base_chain):
        # A random colour step now runs on the tensor: its draw, not the decode, may make the
        # difference, so the distribution over seeds decides (as for any random step).
        judged = _check_chain(base_chain, variant, fetch, seed)
        return Equivalence(judged.verdict, f"{note}: above the bound with a random step on the tensor, so its "
                           f"distribution decides: {judged.detail}", judged.test, judged.p_value, float(worst))
    if worst > max_pixel_diff:
        on_gpu = move == GPU_DECODER and any(str(StepArguments.of(n).device).startswith(CUDA)
                                                   for n in variant.chain.on_device)
        why = f": {GPU_DECODER_CHROMA}" if on_gpu else ""
        return Equivalence(NOT_EQUIVALENT, f"{note}: above the bound{why}", max_abs_diff=float(worst))
    if worst == 0 and move in DECODER_MOVES:
        return _check_chain(base_chain, variant, fetch, seed)
    rest = _check_chain(moved, variant, fetch, seed)
    detail = f"{note}; the rest, against the chain with the same move: {rest.detail}"
    if rest.verdict not in (IDENTICAL, CLOSE):
        return Equivalence(rest.verdict, detail, rest.test, rest.p_value, float(worst))
    return Equivalence(close_within(worst) if worst else rest.verdict, detail, max_abs_diff=float(worst))


def _check_chain(base_chain: Chain, variant: Variant, fetch: Fetch, seed: int) -> Equivalence:
    """Same seed first, then (random chains) the distribution test."""
    base = _Built.of(base_chain)
    try:
        built = _Built.of(variant.chain)
        outcomes = []
        for k in range(SAME_SEED_BATCHES):
            # Fresh inputs for each chain: a transform that works in place must not feed the other.
            outcomes.append(_compare(base(fetch(BATCH_SIZE), seed + k), built(fetch(BATCH_SIZE), seed + k)))
    except Exception as exc:  # a user's transform may fail in any way; the verdict says how
        return Equivalence(FAILS, first_line(exc))
    same_seed = f"{SAME_SEED_BATCHES} seeds x {BATCH_SIZE} samples"
    reasons = [o for o, _ in outcomes if o not in (IDENTICAL, CLOSE)]
    diffs = [d for _, d in outcomes if d is not None]
    max_diff = max(diffs) if diffs else None
    measured = "same outputs under the same seed" if not reasons else reasons[0] + " under the same seed"
    if variant.draws_per_batch:
        return Equivalence(NOT_EQUIVALENT, f"{', '.join(variant.draws_per_batch)} makes one random draw per batch "
                           f"instead of one per sample ({measured}, {same_seed})", max_abs_diff=max_diff)
    if not reasons:
        if all(o == IDENTICAL for o, _ in outcomes):
            return Equivalence(IDENTICAL, f"{measured} ({same_seed})", max_abs_diff=0.0)
        return Equivalence(CLOSE, f"equal within rtol={RTOL:g}, atol={ATOL:g}, max |diff| {max_diff:.3g} "
                           f"({same_seed})", max_abs_diff=max_diff)
    if not (_may_be_random(base_chain) or _may_be_random(variant.chain)):
        return Equivalence(NOT_EQUIVALENT, f"deterministic chain, {measured} ({same_seed})", max_abs_diff=max_diff)
    p, note = _distribution_test(base, built, fetch, seed)
    verdict = SAME_DISTRIBUTION if p >= ALPHA else NOT_EQUIVALENT
    return Equivalence(verdict, f"{measured}; {note}", test=TEST_NAME, p_value=p, max_abs_diff=max_diff)


def chain_failure(chain: Chain, fetch: Fetch, seed: int) -> str:
    """Why the chain cannot make one batch of the dataset's first samples ('' when it can): a
    base chain that fails on its own data leaves every variant nothing to be checked against."""
    try:
        _Built.of(chain)(fetch(BATCH_SIZE), seed)
    except Exception as exc:  # the user's steps on the user's data: any error is the answer
        return first_line(exc)
    return ""
