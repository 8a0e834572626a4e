"""Does a variant compute what the base chain computes? Measured on real samples, never assumed.

First the same-seed check: both chains on the same inputs, each batch under the same seeds;
equal outputs are `identical`, equal within float tolerance (a reordered float computation)
`close`. Otherwise, if a step is random (or declares nothing, so might be), a two-sample
Kolmogorov-Smirnov test on per-sample statistics across many seeds decides between `same
distribution` and `not equivalent`. A random transform moved into the collate makes one draw
per batch instead of one per sample: always `not equivalent`, whatever the test says.

A decode move (a reduced-size decode, the tensor path) changes pixels a little by design. Its
variant is judged in two parts: the steps the move replaced against the originals on the same
files and seeds, as 8-bit images (the largest difference in grey levels after the resize,
against a bound the user sets: `pipebench explore --max-pixel-diff`), then the rest of the
variant against the base chain with the same move applied. Within the bound and the rest
equal: `close`.
"""

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from scipy.stats import ks_2samp
from torch.utils.data import default_collate

from pipebench.explore.variants import DECODE_MOVES, MOVE_FUNCTIONS, Chain, Variant, pixel_prefixes
from pipebench.measure.setup import seed_everything
from pipebench.pipeline.build import build_transforms
from pipebench.pipeline.movement import declared_movement

IDENTICAL = "identical"
CLOSE = "close"
SAME_DISTRIBUTION = "same distribution"
NOT_EQUIVALENT = "not equivalent"
FAILS = "fails"
EQUIVALENT_VERDICTS = (IDENTICAL, CLOSE, SAME_DISTRIBUTION)

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
# The default bound on a reduced-size decode's largest pixel difference after the resize, in grey
# levels. A DCT-scaled decode is a different low-pass filter from the resize's: on the default
# corpus most same-seed crops come out identical (their crop is under twice the output, so no
# draft) and the drafted ones differ most at sharp, grainy edges (up to ~70 levels, measured).
# A generous default keeps the move visible; the user tightens it for their own tolerance.
DEFAULT_MAX_PIXEL_DIFF = 80
# Files the reduced-size decode's first step is compared on, each under its own seed.
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
        return self.verdict in EQUIVALENT_VERDICTS


@dataclass(frozen=True)
class _Built:
    per_sample: Tuple[Callable, ...]
    per_batch: Tuple[Callable, ...]

    @classmethod
    def of(cls, chain: Chain) -> "_Built":
        return cls(tuple(build_transforms(chain.per_sample, "transform.per_sample")),
                   tuple(build_transforms(chain.per_batch, "transform.per_batch")))

    def __call__(self, inputs: Sequence[Any], seed: int) -> torch.Tensor:
        """One batch, as the loader makes it: per-sample steps, default_collate, per-batch steps."""
        seed_everything(seed)
        samples = []
        for sample in inputs:
            for step in self.per_sample:
                sample = step(sample)
            samples.append(sample)
        batch = default_collate(samples)
        for step in self.per_batch:
            batch = step(batch)
        return batch


def _may_be_random(chain: Chain) -> bool:
    movements = [declared_movement(n) for n in (*chain.per_sample, *chain.per_batch)]
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


def check(base_chain: Chain, variant: Variant, fetch: Fetch, seed: int,
          max_pixel_diff: int = DEFAULT_MAX_PIXEL_DIFF) -> Equivalence:
    """The variant's verdict against the base chain; `fetch(n)` returns n fresh input samples."""
    move = next((m for m in variant.moves if m in DECODE_MOVES), None)
    if move is None:
        return _check_chain(base_chain, variant, fetch, seed)
    moved = MOVE_FUNCTIONS[move](base_chain).chain
    try:
        worst = pixel_difference(base_chain, moved, pixel_prefixes(move, base_chain), fetch, seed)
    except Exception as exc:  # a user's files may fail in any way; the verdict says how
        return Equivalence(FAILS, f"{move}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    note = (f"{move}: max |Δ| = {worst} grey levels after the resize over {PIXEL_SAMPLES} files "
            f"(bound {max_pixel_diff}, --max-pixel-diff)")
    if worst > max_pixel_diff:
        return Equivalence(NOT_EQUIVALENT, f"{note}: above the bound", max_abs_diff=float(worst))
    rest = _check_chain(moved, variant, fetch, seed)
    if rest.verdict not in (IDENTICAL, CLOSE):
        return Equivalence(rest.verdict, f"{note}; the rest, against the chain with the same move: {rest.detail}",
                           rest.test, rest.p_value, float(worst))
    return Equivalence(CLOSE if worst else rest.verdict,
                       f"{note}; the rest, against the chain with the same move: {rest.detail}",
                       max_abs_diff=float(worst))


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
        return Equivalence(FAILS, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
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
