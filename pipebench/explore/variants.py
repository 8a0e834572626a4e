"""Generate a chain's variants from what its transforms declare (pipebench.pipeline.movement).

The moves, each legal only where the declarations say so:
- reduced_decode: a first step that resizes down (RandomResizedCrop, Resize) is replaced by its
  draft_form, which decodes the JPEG at 1/2, 1/4 or 1/8 size where its output allows (needs a
  JPEG dataset whose images are at least twice the output size); pixels differ a little;
- tensor_path: decode the JPEG straight to a uint8 tensor (torchvision.io.decode_jpeg) and run
  the steps before the PIL->tensor conversion on it, as their torchvision.transforms.v2 forms
  (`tensor_form`); the conversion keeps only what is left to do (ToTensor: the float scaling);
  pixels differ a little (another decoder, tensor interpolation);
- crop_first: a crop moves ahead of the pointwise steps before it (PIL->tensor conversion
  included), as long as it accepts what arrives there; a step that is not pointwise, or
  declares nothing, stops it;
- fast: every transform with a fast_form is replaced by it, and a cast to float followed by
  Normalize (FUSED_CASTS) by one fused multiply-add on the uint8 pixels;
- per_batch: trailing per-sample transforms with a batch_form move into the collate.
Every combination is tried, moves applied in that order; a combination is kept only if each
of its moves changed something and the chain differs from every earlier variant.
"""

import functools
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.pipeline.movement import PIL, TENSOR, Movement, accepted_kinds, declared_movement

REDUCED_DECODE = "reduced_decode"
TENSOR_PATH = "tensor_path"
CROP_FIRST = "crop_first"
FAST = "fast"
PER_BATCH = "per_batch"
# Canonical order: names list moves in it, and combinations apply them in it.
MOVES = (REDUCED_DECODE, TENSOR_PATH, CROP_FIRST, FAST, PER_BATCH)
# Moves that change pixels a little by design (another decode): equivalence compares their images.
DECODE_MOVES = (REDUCED_DECODE, TENSOR_PATH)
# Casts to float in [0, 1] that Normalize may fuse with (how each reads its input), and the fused form.
FUSED_CASTS = {"torchvision.transforms.ToTensor": "from_pil", "torchvision.transforms.v2.ToTensor": "from_pil",
               "pipebench.transforms.cast.ToFloat": "tensor", "torchvision.transforms.v2.ToDtype": "to_dtype"}
NORMALIZES = ("torchvision.transforms.Normalize", "torchvision.transforms.v2.Normalize")
NORMALIZE_UINT8 = "pipebench.transforms.cast.NormalizeUint8"
PIL_TO_TENSOR = "torchvision.transforms.PILToTensor"
# The catalogue's decoder: torchvision.io.decode_jpeg on the file's bytes, to a uint8 [3, H, W] tensor.
DECODE_JPEG = "pipebench.transforms.decode.DecodeJpeg"
# PIL's name for a JPEG file (Image.format): the only format with DCT-scaled decoding.
JPEG_FORMAT = "JPEG"
# libjpeg's smallest useful DCT reduction: below twice the output size no draft can apply.
MIN_DRAFT_REDUCTION = 2
NAME_SEPARATOR = "+"

Node = Mapping[str, Any]


def short_name(node: Node) -> str:
    """`torchvision.transforms.RandomCrop` -> `RandomCrop`."""
    return str(node["_target_"]).rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Chain:
    """A transform config: `_target_` nodes per sample, then per batch."""

    per_sample: Tuple[Node, ...]
    per_batch: Tuple[Node, ...] = ()

    def as_config(self) -> Dict[str, List[Dict[str, Any]]]:
        """The body of a Hydra `transform/<name>.yaml`."""
        return {"per_sample": [dict(n) for n in self.per_sample], "per_batch": [dict(n) for n in self.per_batch]}

    def key(self) -> str:
        """Equal for equal chains, so variants that yield the same chain can be dropped."""
        return json.dumps(self.as_config(), sort_keys=True, default=str)


@dataclass(frozen=True)
class SampleSource:
    """What the dataset gives, read from its first sample: a file format (PIL's name, JPEG, PNG, ...),
    `decoded image` or `tensor`, and the image's (width, height) when it is an image."""

    kind: str
    size: Optional[Tuple[int, int]] = None

    @classmethod
    def of(cls, sample: Any) -> "SampleSource":
        size = getattr(sample, "size", None)
        if isinstance(size, tuple) and len(size) == 2:
            return cls(getattr(sample, "format", None) or "decoded image", size)
        return cls(type(sample).__name__.lower())


@dataclass(frozen=True)
class Moved:
    """What one move did to a chain: nothing (with the reason) or a new chain and its changes in words."""

    chain: Chain
    changes: Tuple[str, ...] = ()
    reason: str = ""
    # Random transforms that now make one draw per batch instead of one per sample.
    draws_per_batch: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Variant:
    name: str
    moves: Tuple[str, ...]
    changes: Tuple[str, ...]
    chain: Chain
    draws_per_batch: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Exploration:
    """The base chain first, then its variants; `not_applied` says why each inapplicable move is."""

    variants: Tuple[Variant, ...]
    not_applied: Tuple[str, ...] = field(default=())

    @property
    def base(self) -> Variant:
        return self.variants[0]


def crop_first(chain: Chain) -> Moved:
    """Move each crop ahead of the pointwise steps before it, as far as its declarations allow."""
    steps = list(chain.per_sample)
    movements = [declared_movement(n) for n in steps]
    kinds = list(accepted_kinds(movements))  # crops keep the kind, so these stay valid as crops move
    changes, reasons = [], []
    crops = [i for i, m in enumerate(movements) if m is not None and m.crop]
    if not crops:
        return Moved(chain, reason="crop_first: no per-sample transform declares itself a crop")
    for i in crops:
        crop, name = movements[i], short_name(steps[i])
        target = i
        while target > 0:
            before, before_name = movements[target - 1], short_name(steps[target - 1])
            arriving = kinds[target - 1]
            if before is None:
                reasons.append(f"{name} cannot move ahead of {before_name}, which declares nothing")
            elif not before.pointwise:
                reasons.append(f"{name} cannot move ahead of {before_name}, which is not pointwise")
            elif arriving is None or not arriving <= crop.accepts:
                what = "an input of unknown kind" if arriving is None else "+".join(sorted(arriving))
                reasons.append(f"{name} cannot move ahead of {before_name}: it does not accept {what}")
            else:
                target -= 1
                continue
            break
        if target < i:
            passed = ", ".join(short_name(n) for n in steps[target:i])
            changes.append(f"move {name} ahead of {passed}")
            steps.insert(target, steps.pop(i))
            movements.insert(target, movements.pop(i))
        elif target == 0:
            reasons.append(f"{name} is already first")
    return Moved(Chain(tuple(steps), chain.per_batch), tuple(changes),
                 "" if changes else "crop_first: " + "; ".join(reasons))


def _with_target(node: Node, target: str) -> Dict[str, Any]:
    return {**node, "_target_": target}


def _fused_cast(cast: Node, normalize: Node) -> Optional[Tuple[Node, ...]]:
    """The fused form of a cast to float in [0, 1] then Normalize, or None when they are not that pair."""
    kind = FUSED_CASTS.get(str(cast["_target_"]))
    if kind is None or normalize["_target_"] not in NORMALIZES or normalize.get("inplace"):
        return None
    if kind == "to_dtype" and not (cast.get("scale") and str(cast.get("dtype", {}).get("path", "")) == "torch.float32"):
        return None
    fused = {"_target_": NORMALIZE_UINT8, "mean": normalize["mean"], "std": normalize["std"]}
    return (_with_target({}, PIL_TO_TENSOR), fused) if kind == "from_pil" else (fused,)


def fast(chain: Chain) -> Moved:
    """Replace every transform that declares a fast_form by it (same arguments), and every cast to
    float followed by Normalize by the fused form."""
    changes = []
    sample_nodes: List[Node] = []
    batch_nodes: List[Node] = []
    for nodes, out in ((chain.per_sample, sample_nodes), (chain.per_batch, batch_nodes)):
        for node in nodes:
            movement = declared_movement(node)
            if movement is not None and movement.fast_form:
                replaced = _with_target(node, movement.fast_form)
                changes.append(f"replace {short_name(node)} with {short_name(replaced)}")
                node = replaced
            fused = _fused_cast(out[-1], node) if out else None
            if fused is not None:
                changes.append(f"replace {short_name(out[-1])}, {short_name(node)} with "
                               f"{', '.join(short_name(n) for n in fused)} (one multiply-add on the uint8 pixels)")
                out[-1:] = fused
                continue
            out.append(node)
    return Moved(Chain(tuple(sample_nodes), tuple(batch_nodes)), tuple(changes),
                 "" if changes else "fast: no transform in the chain declares a fast_form")


def per_batch(chain: Chain) -> Moved:
    """Move trailing per-sample transforms that declare a batch_form into the collate, ahead of
    the existing per-batch steps."""
    steps = list(chain.per_sample)
    moved: List[Node] = []
    random_moved: List[str] = []
    while steps:
        movement: Optional[Movement] = declared_movement(steps[-1])
        if movement is None or not movement.batch_form:
            break
        node = steps.pop()
        moved.insert(0, _with_target(node, movement.batch_form))
        if movement.random:
            random_moved.insert(0, short_name(node))
    if not moved:
        last = short_name(chain.per_sample[-1]) if chain.per_sample else None
        why = "there are no per-sample transforms" if last is None else f"the last per-sample transform, {last}, " \
              "declares no batch_form"
        return Moved(chain, reason=f"per_batch: {why}")
    changes = tuple(f"run {short_name(n)} once per batch as {short_name(b)}"
                    for n, b in zip(chain.per_sample[len(steps):], moved))
    return Moved(Chain(tuple(steps), (*moved, *chain.per_batch)), changes, draws_per_batch=tuple(random_moved))


def _output_size(node: Node, image: Tuple[int, int]) -> Tuple[int, int]:
    """(w, h) a RandomResizedCrop or Resize node makes of a (w, h) image."""
    size = node.get("size")
    sizes = [size] if isinstance(size, int) else list(size)
    if len(sizes) == 2 or "RandomResizedCrop" in str(node["_target_"]):
        return (sizes[-1], sizes[0])
    short, long = sorted(image)
    scaled = (sizes[0], int(sizes[0] * long / short))
    return scaled if image[0] <= image[1] else scaled[::-1]


def reduced_decode(chain: Chain, source: Optional[SampleSource] = None) -> Moved:
    """Replace a first step that resizes down by its draft_form (decode the JPEG at reduced size)."""
    skipped = _not_jpeg(REDUCED_DECODE, source)
    if skipped:
        return Moved(chain, reason=skipped)
    if not chain.per_sample:
        return Moved(chain, reason=f"{REDUCED_DECODE}: there are no per-sample transforms")
    first = chain.per_sample[0]
    name, movement = short_name(first), declared_movement(first)
    if movement is None or not movement.draft_form:
        pads = name == "RandomCrop" and movement is not None and not movement.crop
        why = "pads, so a reduced-size decode would change what the padding surrounds" if pads else \
            "does not resize the image down (declares no draft_form)"
        return Moved(chain, reason=f"{REDUCED_DECODE}: the first step, {name}, {why}")
    if source is not None and source.size is not None:
        out = _output_size(first, source.size)
        width, height = source.size
        if "Resize" == name and (out[0] >= width or out[1] >= height):
            return Moved(chain, reason=f"{REDUCED_DECODE}: {name} to {out[0]}x{out[1]} upsamples the "
                                       f"{width}x{height} images")
        if width // MIN_DRAFT_REDUCTION < out[0] or height // MIN_DRAFT_REDUCTION < out[1]:
            return Moved(chain, reason=f"{REDUCED_DECODE}: a draft at 1/{MIN_DRAFT_REDUCTION} of the {width}x{height} "
                                       f"images would go below {name}'s output size {out[0]}x{out[1]}")
    drafted = _with_target(first, movement.draft_form)
    return Moved(Chain((drafted, *chain.per_sample[1:]), chain.per_batch),
                 (f"replace {name} with {short_name(drafted)} (decode the JPEG at 1/2, 1/4 or 1/8 size, libjpeg's "
                  "DCT scaling, wherever the region kept is at least that many times the output)",))


def _not_jpeg(move: str, source: Optional[SampleSource]) -> str:
    if source is not None and source.kind != JPEG_FORMAT:
        return f"{move}: the dataset gives {source.kind} samples, not JPEG files: decode moves skipped"
    return ""


def _conversion_at(chain: Chain) -> Optional[int]:
    """Where the chain turns its PIL image into a tensor (PILToTensor, ToTensor, ToImage), or None."""
    return next((i for i, m in enumerate(declared_movement(n) for n in chain.per_sample)
                 if m is not None and m.returns == TENSOR and PIL in m.accepts), None)


def tensor_path(chain: Chain, source: Optional[SampleSource] = None) -> Moved:
    """Decode to a uint8 tensor first; the PIL steps before the conversion run as their tensor forms."""
    skipped = _not_jpeg(TENSOR_PATH, source)
    if skipped:
        return Moved(chain, reason=skipped)
    at = _conversion_at(chain)
    if at is None:
        return Moved(chain, reason=f"{TENSOR_PATH}: no step turns the PIL image into a tensor (PILToTensor, "
                                   "ToTensor, ToImage)")
    before = chain.per_sample[:at]
    if not before:  # the conversion comes first: that is issue 13's decoder move alone
        return Moved(chain, reason=f"{TENSOR_PATH}: no step runs on the PIL image before "
                                   f"{short_name(chain.per_sample[at])} (the decoder move covers it)")
    blocking = [short_name(n) for n in before if not (m := declared_movement(n)) or not m.tensor_form]
    if blocking:
        return Moved(chain, reason=f"{TENSOR_PATH}: {', '.join(blocking)} runs on the PIL image before "
                                   f"{short_name(chain.per_sample[at])} and declares no tensor form")
    conversion = chain.per_sample[at]
    left = declared_movement(conversion).tensor_form
    moved = [_with_target(n, declared_movement(n).tensor_form) for n in before]
    rest = ([_with_target(conversion, left)] if left else []) + list(chain.per_sample[at + 1:])
    changes = [f"decode the JPEG with {short_name({'_target_': DECODE_JPEG})} (torchvision.io.decode_jpeg, straight "
               "to a uint8 tensor) instead of PIL"]
    changes += [f"run {short_name(n)} on the tensor as {m['_target_'].rsplit('.', 2)[-2]}.{short_name(m)}"
                for n, m in zip(before, moved)]
    if not left:
        changes.append(f"drop {short_name(conversion)} (the decoder gives the tensor)")
    elif left != conversion["_target_"]:
        changes.append(f"replace {short_name(conversion)} with {short_name(rest[0])}")
    return Moved(Chain(({"_target_": DECODE_JPEG}, *moved, *rest), chain.per_batch), tuple(changes))


def pixel_prefixes(move: str, chain: Chain) -> Tuple[int, int]:
    """How many leading per-sample steps of the chain, and of the chain `move` makes of it, produce the
    8-bit image the move changes (compared in grey levels before any float conversion)."""
    if move == TENSOR_PATH:
        at = _conversion_at(chain)
        return at, at + 1
    return 1, 1


MOVE_FUNCTIONS: Mapping[str, Callable[[Chain], Moved]] = {REDUCED_DECODE: reduced_decode, TENSOR_PATH: tensor_path,
                                                          CROP_FIRST: crop_first, FAST: fast, PER_BATCH: per_batch}


def move_functions(source: Optional[SampleSource]) -> Mapping[str, Callable[[Chain], Moved]]:
    """MOVE_FUNCTIONS, with the decode moves told what the dataset gives."""
    return {**MOVE_FUNCTIONS, REDUCED_DECODE: functools.partial(reduced_decode, source=source),
            TENSOR_PATH: functools.partial(tensor_path, source=source)}


def _apply(chain: Chain, moves: Sequence[str], functions: Mapping[str, Callable[[Chain], Moved]]
           ) -> Optional[Moved]:
    """Apply moves in order; None when one of them changes nothing (that combination adds nothing)."""
    changes: List[str] = []
    draws: List[str] = []
    for move in moves:
        done = functions[move](chain)
        if not done.changes:
            return None
        chain = done.chain
        changes += done.changes
        draws += done.draws_per_batch
    return Moved(chain, tuple(changes), draws_per_batch=tuple(draws))


def explore(name: str, chain: Chain, source: Optional[SampleSource] = None) -> Exploration:
    """The base chain and every distinct variant: single moves first, then pairs, and so on.
    `source` (the dataset's first sample) lets the decode moves skip a dataset they cannot serve."""
    functions = move_functions(source)
    variants = [Variant(name, (), (), chain)]
    seen = {chain.key()}
    for size in range(1, len(MOVES) + 1):
        for moves in itertools.combinations(MOVES, size):
            done = _apply(chain, moves, functions)
            if done is None or done.chain.key() in seen:
                continue
            seen.add(done.chain.key())
            variants.append(Variant(NAME_SEPARATOR.join((name, *moves)), moves, done.changes, done.chain,
                                    done.draws_per_batch))
    not_applied = tuple(done.reason for done in (functions[m](chain) for m in MOVES) if not done.changes)
    return Exploration(tuple(variants), not_applied)
