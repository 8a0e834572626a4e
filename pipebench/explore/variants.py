"""Generate a chain's variants from what its transforms declare (pipebench.pipeline.movement).

The moves, each legal only where the declarations say so:
- reduced_decode: a first step that resizes down (RandomResizedCrop, Resize) is replaced by its
  draft_form, which decodes the JPEG at 1/2, 1/4 or 1/8 size where its output allows (needs a
  JPEG dataset whose images are at least twice the output size); pixels differ a little;
- tensor_path: decode the JPEG straight to a uint8 tensor (torchvision.io.decode_jpeg) and run
  the steps before the PIL->tensor conversion on it, as their torchvision.transforms.v2 forms
  (`tensor_form`); the conversion keeps only what is left to do (ToTensor: the float scaling);
  pixels differ a little (another decoder, tensor interpolation);
- decoder: the PIL->tensor conversion is replaced by the decoder it names (`decoder_form`:
  torchvision.io.decode_jpeg on the file's bytes); crops that ran on the PIL image before it
  follow it, on the tensor, as the decoder reads the whole file;
- crop_first: a crop moves ahead of the pointwise steps before it (PIL->tensor conversion
  included), as long as it accepts what arrives there; a step that is not pointwise, or
  declares nothing, stops it;
- fast: every transform with a fast_form is replaced by the last of its fast forms, and a cast
  to float followed by Normalize (FUSED_CASTS) by one fused multiply-add on the uint8 pixels;
- per_batch: trailing per-sample transforms with a batch_form move into the collate (a crop
  stays: it shrinks the sample, so it runs before the batch is made);
- late_cast: the trailing steps that turn integer pixels into float (`casts`) run after the
  host-to-device copy (`on_device`), so the batch crosses the worker boundary, the pinning and
  the copy as uint8;
- to_device: every trailing batch-able step runs after the copy, on the consumer's device (a
  random step only if its batch form keeps one draw a sample; a crop stays, as for per_batch);
- gpu_decoder: the worker only reads the JPEG file's bytes; after the copy the whole batch is
  decoded in one call on the consumer's device (nvJPEG on CUDA), then cropped there (the crop's
  batch form), then every later step runs there as its batch form (to_device's rules).
The first five stack; the next three are alternative places for the chain's tail. The three
decode moves (tensor_path, decoder, reduced_decode) replace the same decode, so in the stack the
first of them that applies takes it and the others then find nothing to do. gpu_decoder replaces
both the decode and the tail, so it stacks only with the moves that touch neither. Variants: each
move alone, then the stack built up one move at a time (a move that changes nothing is left out),
then the full stack with each tail, then gpu_decoder on the stack of the others. That is a ladder
from the base chain to the most-moved one, so explore can show what each edit is worth on its own
and on the way to the winner. A chain that equals an earlier variant is dropped.
"""

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.pipeline.consumers import HOST_DEVICE
from pipebench.pipeline.movement import PIL, TENSOR, Movement, accepted_kinds, declared_movement

REDUCED_DECODE = "reduced_decode"
TENSOR_PATH = "tensor_path"
DECODER = "decoder"
CROP_FIRST = "crop_first"
FAST = "fast"
PER_BATCH = "per_batch"
LATE_CAST = "late_cast"
TO_DEVICE = "to_device"
GPU_DECODER = "gpu_decoder"
# Moves that stack, in the order the ladder applies them (the decode moves first: see the docstring).
STACKED = (TENSOR_PATH, DECODER, REDUCED_DECODE, CROP_FIRST, FAST)
# Alternative homes for the chain's tail: the collate, or after the host-to-device copy.
TAILS = (PER_BATCH, LATE_CAST, TO_DEVICE)
# What gpu_decoder stacks on: it replaces the decode and the tail, so not the decode moves.
STACKED_UNDER_GPU_DECODER = (CROP_FIRST, FAST)
# Canonical order: names list moves in it.
MOVES = (*STACKED, *TAILS, GPU_DECODER)
# Moves that change pixels a little by design (another decode): equivalence compares their images.
DECODE_MOVES = (REDUCED_DECODE, TENSOR_PATH)
# Moves whose gain needs an accelerator: on a host without one they are generated and checked
# (on the CPU) but not measured, as the host CPU would do the work the device is for.
DEVICE_MOVES = (TO_DEVICE, GPU_DECODER)
# Loader moves: one DataLoader setting each, on top of the most-moved chain a host can run.
# persistent_workers pays through the epoch restart (samples_per_s_epoch), the others through
# delivery: more batches queued, pinned memory for the copy, another way to share tensors.
PERSISTENT_WORKERS = "persistent_workers"
PREFETCH_FACTOR = "prefetch_factor"
PIN_MEMORY = "pin_memory"
SHARING_STRATEGY = "sharing_strategy"
LOADER_MOVES = (PERSISTENT_WORKERS, PREFETCH_FACTOR, PIN_MEMORY, SHARING_STRATEGY)
FILE_SYSTEM = "file_system"
# Casts to float in [0, 1] that Normalize may fuse with (how each reads its input), and the fused form.
FUSED_CASTS = {"torchvision.transforms.ToTensor": "from_pil", "torchvision.transforms.v2.ToTensor": "from_pil",
               "pipebench.transforms.cast.ToFloat": "tensor", "torchvision.transforms.v2.ToDtype": "to_dtype"}
NORMALIZES = ("torchvision.transforms.Normalize", "torchvision.transforms.v2.Normalize")
NORMALIZE_UINT8 = "pipebench.transforms.cast.NormalizeUint8"
PIL_TO_TENSOR = "torchvision.transforms.PILToTensor"
# The catalogue's decoder: torchvision.io.decode_jpeg on the file's bytes, to a uint8 [3, H, W] tensor.
DECODE_JPEG = "pipebench.transforms.decode.DecodeJpeg"
# Its batched split at the copy (gpu_decoder): the file's bytes in the worker, one decode call after.
READ_JPEG_BYTES = "pipebench.transforms.decode.ReadJpegBytes"
BATCH_DECODE_JPEG = "pipebench.transforms.decode.BatchDecodeJpeg"
# The device type nvJPEG needs.
CUDA = "cuda"
# PIL's name for a JPEG file (Image.format): the only format with DCT-scaled decoding.
JPEG_FORMAT = "JPEG"
# libjpeg's smallest useful DCT reduction: below twice the output size no draft can apply.
MIN_DRAFT_REDUCTION = 2
NAME_SEPARATOR = "+"

Node = Mapping[str, Any]


def class_name(target: str) -> str:
    """`torchvision.transforms.RandomCrop` -> `RandomCrop`."""
    return str(target).rsplit(".", 1)[-1]


def short_name(node: Node) -> str:
    """A node's class name (class_name of its `_target_`)."""
    return class_name(node["_target_"])


@dataclass(frozen=True)
class Chain:
    """A transform config: `_target_` nodes per sample, then per batch."""

    per_sample: Tuple[Node, ...]
    per_batch: Tuple[Node, ...] = ()
    # Run on the batch after the host-to-device copy (transform.on_device).
    on_device: Tuple[Node, ...] = ()

    def as_config(self) -> Dict[str, List[Dict[str, Any]]]:
        """The body of a Hydra `transform/<name>.yaml` (`on_device` only when it has steps)."""
        config = {"per_sample": [dict(n) for n in self.per_sample], "per_batch": [dict(n) for n in self.per_batch]}
        if self.on_device:
            config["on_device"] = [dict(n) for n in self.on_device]
        return config

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
    # Loader settings the variant sets (`loader.<key>`), for the loader moves; the chain is its parent's.
    loader: Tuple[Tuple[str, Any], ...] = ()

    def key(self) -> str:
        """Equal for equal chains with equal loader settings."""
        return self.chain.key() + json.dumps(self.loader, default=str)

    @property
    def needs_device(self) -> bool:
        """Its gain needs an accelerator (a move in DEVICE_MOVES)."""
        return any(move in DEVICE_MOVES for move in self.moves)


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
    return Moved(Chain(tuple(steps), chain.per_batch, chain.on_device), tuple(changes),
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


def _fastest(node: Node) -> Tuple[Node, Optional[Movement]]:
    """The node after following its fast forms to the last (a form naming itself, or a loop, stops it)."""
    seen = {node["_target_"]}
    movement = declared_movement(node)
    while movement is not None and movement.fast_form and movement.fast_form not in seen:
        node = _with_target(node, movement.fast_form)
        seen.add(node["_target_"])
        movement = declared_movement(node)
    return node, movement


def fast(chain: Chain) -> Moved:
    """Replace every transform that declares a fast_form by the last of its fast forms (same
    arguments), and every cast to float followed by Normalize by the fused form."""
    changes = []
    stages: List[List[Node]] = []
    for nodes in (chain.per_sample, chain.per_batch, chain.on_device):
        out: List[Node] = []
        for node in nodes:
            replaced, _ = _fastest(node)
            if replaced["_target_"] != node["_target_"]:
                changes.append(f"replace {short_name(node)} with {short_name(replaced)}")
            fused = _fused_cast(out[-1], replaced) if out else None
            if fused is not None:
                changes.append(f"replace {short_name(out[-1])}, {short_name(replaced)} with "
                               f"{', '.join(short_name(n) for n in fused)} (one multiply-add on the uint8 pixels)")
                out[-1:] = fused
                continue
            out.append(replaced)
        stages.append(out)
    return Moved(Chain(*(tuple(out) for out in stages)), tuple(changes),
                 "" if changes else "fast: no transform in the chain declares a fast_form")


def per_batch(chain: Chain) -> Moved:
    """Move trailing per-sample transforms that declare a batch_form into the collate, ahead of
    the existing per-batch steps."""
    steps = list(chain.per_sample)
    moved: List[Node] = []
    random_moved: List[str] = []
    while steps:
        movement: Optional[Movement] = declared_movement(steps[-1])
        if movement is None or not movement.batch_form or movement.crop:  # a crop shrinks the sample: it stays
            break
        node = steps.pop()
        moved.insert(0, _with_target(node, movement.batch_form))
        if movement.random and not movement.batch_draws_per_sample:
            random_moved.insert(0, short_name(node))
    if not moved:
        last = short_name(chain.per_sample[-1]) if chain.per_sample else None
        why = "there are no per-sample transforms" if last is None else f"the last per-sample transform, {last}, " \
              "declares no batch_form"
        return Moved(chain, reason=f"per_batch: {why}")
    changes = tuple(f"run {short_name(n)} once per batch as {short_name(b)}"
                    for n, b in zip(chain.per_sample[len(steps):], moved))
    return Moved(Chain(tuple(steps), (*moved, *chain.per_batch), chain.on_device), changes,
                 draws_per_batch=tuple(random_moved))


def _output_size(node: Node, image: Tuple[int, int]) -> Tuple[int, int]:
    """(w, h) a RandomResizedCrop or Resize node makes of a (w, h) image."""
    size = node.get("size")
    sizes = [size] if isinstance(size, int) else list(size)
    if len(sizes) == 2 or "RandomResizedCrop" in str(node["_target_"]):
        return (sizes[-1], sizes[0])
    short, long = sorted(image)
    scaled = (sizes[0], int(sizes[0] * long / short))
    return scaled if image[0] <= image[1] else scaled[::-1]


def decoder_conversion(chain: Chain) -> Optional[int]:
    """Where the chain's PIL->tensor conversion that declares a decoder_form is, or None."""
    return next((i for i, m in enumerate(declared_movement(n) for n in chain.per_sample)
                 if m is not None and m.decoder_form), None)


def decoder(chain: Chain, move: str = DECODER) -> Moved:
    """Replace the chain's PIL->tensor conversion by the decoder it declares; PIL-side crops before
    it follow it (the decoder reads the whole file, so a crop first would only make it fall back).
    `move` names the move in the reasons (gpu_decoder starts from this one)."""
    steps = list(chain.per_sample)
    movements = [declared_movement(n) for n in steps]
    at = decoder_conversion(chain)
    if at is None:
        first = movements[0] if movements else None
        if first is not None and first.accepts == frozenset([TENSOR]):
            return Moved(chain, reason=f"{move}: the chain starts from tensors ({short_name(steps[0])} accepts only "
                                       "tensors): there is no image file to decode")
        return Moved(chain, reason=f"{move}: no step declares a decoder_form (a PIL->tensor conversion such as "
                                   "PILToTensor)")
    before = [(n, m) for n, m in zip(steps[:at], movements[:at])]
    blocking = [short_name(n) for n, m in before if m is None or not m.crop or TENSOR not in m.accepts]
    if blocking:
        return Moved(chain, reason=f"{move}: {', '.join(blocking)} runs on the PIL image before "
                                   f"{short_name(steps[at])}, and only a crop can follow the decoder")
    conversion = steps[at]
    decoded = _with_target(conversion, movements[at].decoder_form)
    changes = [f"replace {short_name(conversion)} with {short_name(decoded)} (decode the JPEG file straight to a "
               "uint8 tensor)"]
    if before:
        changes.append(f"move {', '.join(short_name(n) for n, _ in before)} after {short_name(decoded)}")
    new_steps = (decoded, *(n for n, _ in before), *steps[at + 1:])
    return Moved(Chain(new_steps, chain.per_batch, chain.on_device), tuple(changes))


def _keeps_draws(movement: Movement) -> bool:
    """Its batch form keeps the per-sample distribution: not random, or one draw a sample."""
    return not movement.random or movement.batch_draws_per_sample


def _device_tail(chain: Chain, wanted: Callable[[Movement], bool], what: str) -> Tuple[Chain, Tuple[str, ...], str]:
    """(the chain with its trailing run of steps that `wanted` accepts moved to on_device, the changes,
    why the step before that run did not move: "" when none is left). The run moves ahead of the
    existing on_device steps: first from per_batch (as they are), then, when per_batch is all gone,
    from per_sample (as their batch forms). A random step moves only if its batch form keeps one
    draw a sample."""
    per_batch_steps, per_sample_steps = list(chain.per_batch), list(chain.per_sample)
    moved: List[Node] = []
    changes: List[str] = []
    stop = ""
    while per_batch_steps:
        movement = declared_movement(per_batch_steps[-1])
        if movement is None or not wanted(movement) or not _keeps_draws(movement):
            stop = f"{short_name(per_batch_steps[-1])} (per batch) is not {what}"
            break
        node = per_batch_steps.pop()
        moved.insert(0, node)
        changes.insert(0, f"run {short_name(node)} after the host-to-device copy")
    while not per_batch_steps and per_sample_steps:
        node = per_sample_steps[-1]
        movement = declared_movement(node)
        if movement is None or not movement.batch_form or not wanted(movement) or movement.crop \
                or not _keeps_draws(movement):
            stop = f"{short_name(node)} is a crop, which shrinks the sample before the copy" \
                if movement is not None and movement.crop else f"{short_name(node)} is not {what} with a batch form" + \
                (" that draws once a sample" if movement is not None and movement.random else "")
            break
        per_sample_steps.pop()
        batch = _with_target(node, movement.batch_form)
        moved.insert(0, batch)
        changes.insert(0, f"run {short_name(node)} after the host-to-device copy as {short_name(batch)}")
    return Chain(tuple(per_sample_steps), tuple(per_batch_steps), (*moved, *chain.on_device)), tuple(changes), stop


def _tail_to_device(chain: Chain, move: str, wanted: Callable[[Movement], bool], what: str) -> Moved:
    """Move the trailing run of steps that `wanted` accepts to on_device (_device_tail)."""
    moved, changes, stop = _device_tail(chain, wanted, what)
    if not changes:
        return Moved(chain, reason=f"{move}: the last step, {stop}" if stop else f"{move}: the chain is empty")
    return Moved(moved, changes)


def late_cast(chain: Chain) -> Moved:
    """Keep the batch uint8 across the worker boundary and the copy: the trailing casts run after it."""
    return _tail_to_device(chain, LATE_CAST, lambda m: m.casts, "a cast to float (declares casts)")


def _any_step(movement: Movement) -> bool:
    """to_device's filter: any step may go (the batch form and draw rules still apply)."""
    return True


# How to_device's reasons call a step it would move.
BATCHABLE = "batch-able"


def to_device(chain: Chain) -> Moved:
    """Run every trailing batch-able step after the copy, on the consumer's device."""
    return _tail_to_device(chain, TO_DEVICE, _any_step, BATCHABLE)


def _batch_decode_change(device: str) -> str:
    """gpu_decoder's decode, in words, for where it will run."""
    if device.startswith(CUDA):
        return f"decode the batch on the GPU after the copy ({class_name(BATCH_DECODE_JPEG)}, nvJPEG)"
    return (f"decode the batch in one call after the copy, on {device} here ({class_name(BATCH_DECODE_JPEG)}; "
            "nvJPEG where there is a CUDA device)")


def _device_crops(steps: Sequence[Node]) -> Tuple[List[Node], str]:
    """(the batch forms of the crops that lead `steps`, or [] with why they cannot run on the device):
    a crop must come first, as the decoded images differ in size until one stacks them."""
    crops: List[Node] = []
    for node in steps:
        movement = declared_movement(node)
        if movement is None or not movement.crop:
            break
        if not movement.batch_form or not _keeps_draws(movement):
            lacks = "no batch form" if not movement.batch_form else "a batch form that draws once a batch"
            return [], f"{short_name(node)}, the crop after the decode, has {lacks}"
        crops.append(_with_target(node, movement.batch_form))
    if not crops:
        first = f"{short_name(steps[0])} comes first" if steps else "nothing comes"
        return [], f"no crop follows the decode ({first}), so the decoded images cannot be stacked into one batch"
    return crops, ""


def gpu_decoder(chain: Chain, source: Optional[SampleSource] = None, device: str = HOST_DEVICE) -> Moved:
    """Read the JPEG file's bytes in the worker and decode the batch in one call after the copy, on
    `device` (nvJPEG on CUDA); the crop, then every later step, run there as their batch forms."""
    skipped = _not_jpeg(GPU_DECODER, source)
    if skipped:
        return Moved(chain, reason=skipped)
    decoded = decoder(chain, GPU_DECODER)
    if not decoded.changes:
        return decoded
    first, *steps = decoded.chain.per_sample
    if first["_target_"] != DECODE_JPEG:
        return Moved(chain, reason=f"{GPU_DECODER}: the declared decoder, {short_name(first)}, has no batched form "
                                   f"on the device (only {class_name(DECODE_JPEG)} has)")
    crops, why = _device_crops(steps)
    if not crops:
        return Moved(chain, reason=f"{GPU_DECODER}: {why}")
    rest = Chain(tuple(steps[len(crops):]), chain.per_batch, chain.on_device)
    tail, tail_changes, stop = _device_tail(rest, _any_step, BATCHABLE)
    if tail.per_sample or tail.per_batch:
        return Moved(chain, reason=f"{GPU_DECODER}: {stop}, so it cannot run on the device after the decode")
    conversion = chain.per_sample[decoder_conversion(chain)]
    changes = (f"read the JPEG bytes in the worker ({class_name(READ_JPEG_BYTES)}) in place of PIL's "
               f"decode and {short_name(conversion)}", _batch_decode_change(device),
               *(f"crop on the device: {short_name(n)} as {short_name(b)}" for n, b in zip(steps, crops)),
               *tail_changes)
    on_device = ({"_target_": BATCH_DECODE_JPEG, "device": device}, *crops, *tail.on_device)
    return Moved(Chain(({"_target_": READ_JPEG_BYTES},), (), on_device), changes)


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
    return Moved(Chain((drafted, *chain.per_sample[1:]), chain.per_batch, chain.on_device),
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
    changes = [f"decode the JPEG with {class_name(DECODE_JPEG)} (torchvision.io.decode_jpeg, straight "
               "to a uint8 tensor) instead of PIL"]
    changes += [f"run {short_name(n)} on the tensor as {m['_target_'].rsplit('.', 2)[-2]}.{short_name(m)}"
                for n, m in zip(before, moved)]
    if not left:
        changes.append(f"drop {short_name(conversion)} (the decoder gives the tensor)")
    elif left != conversion["_target_"]:
        changes.append(f"replace {short_name(conversion)} with {short_name(rest[0])}")
    return Moved(Chain(({"_target_": DECODE_JPEG}, *moved, *rest), chain.per_batch, chain.on_device),
                 tuple(changes))


def pixel_prefixes(move: str, chain: Chain) -> Tuple[int, int]:
    """How many leading per-sample steps of the chain, and of the chain `move` makes of it, produce the
    8-bit image the move changes (compared in grey levels before any float conversion)."""
    if move == TENSOR_PATH:
        at = _conversion_at(chain)
        return at, at + 1
    return 1, 1


MOVE_FUNCTIONS: Mapping[str, Callable[[Chain], Moved]] = {
    REDUCED_DECODE: reduced_decode, TENSOR_PATH: tensor_path, DECODER: decoder, CROP_FIRST: crop_first, FAST: fast,
    PER_BATCH: per_batch, LATE_CAST: late_cast, TO_DEVICE: to_device, GPU_DECODER: gpu_decoder}


def move_functions(source: Optional[SampleSource], device: str = HOST_DEVICE) -> Mapping[str, Callable[[Chain], Moved]]:
    """MOVE_FUNCTIONS, with the decode moves told what the dataset gives, and gpu_decoder where the
    on_device steps run (the consumer's device, or the host CPU)."""
    return {**MOVE_FUNCTIONS, REDUCED_DECODE: functools.partial(reduced_decode, source=source),
            TENSOR_PATH: functools.partial(tensor_path, source=source),
            GPU_DECODER: functools.partial(gpu_decoder, source=source, device=device)}


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


def _ladder(chain: Chain, functions: Mapping[str, Callable[[Chain], Moved]]) -> List[Tuple[str, ...]]:
    """The move lists to try: each move alone, the stack built up one move at a time, the full
    stack with each tail, gpu_decoder on the stack of the moves it leaves alone."""
    stack = _stack(chain, functions, STACKED)
    singles = [(move,) for move in MOVES]
    built = [tuple(stack[:k]) for k in range(2, len(stack) + 1)]
    tails = [(*stack, tail) for tail in TAILS] if len(stack) > 0 else []
    under_gpu = _stack(chain, functions, STACKED_UNDER_GPU_DECODER)
    return [*singles, *built, *tails, *([(*under_gpu, GPU_DECODER)] if under_gpu else [])]


def _stack(chain: Chain, functions: Mapping[str, Callable[[Chain], Moved]], moves: Sequence[str]) -> List[str]:
    """The moves of `moves` that change the chain when applied in order, each on the last's result."""
    stack: List[str] = []
    for move in moves:
        done = functions[move](chain)
        if done.changes:
            stack.append(move)
            chain = done.chain
    return stack


@dataclass(frozen=True)
class LoaderSetting:
    """What loader moves look at: the job's workers, its loader settings, and whether CUDA is here."""

    workers: int
    values: Mapping[str, Any]
    cuda: bool
    max_prefetch_factor: int


def _loader_change(move: str, setting: LoaderSetting) -> Tuple[Optional[Any], str]:
    """(the new value of loader.<move>, "") or (None, why the move does not apply)."""
    current = setting.values[move]
    if move == PIN_MEMORY:
        if not setting.cuda:
            return None, "pin_memory: no CUDA device here, so pinning does nothing"
        return (True, "") if not current else (None, "pin_memory: already on")
    if setting.workers == 0:
        return None, f"{move}: the loader has no workers (workers=0), so the setting does nothing"
    if move == PERSISTENT_WORKERS:
        return (True, "") if not current else (None, "persistent_workers: already on")
    if move == PREFETCH_FACTOR:
        doubled = min(2 * int(current), setting.max_prefetch_factor)
        return (doubled, "") if doubled != current else (None, "prefetch_factor: already at its largest")
    return (FILE_SYSTEM, "") if current != FILE_SYSTEM else (None, "sharing_strategy: already file_system")


def loader_variants(parent: Variant, setting: LoaderSetting) -> Tuple[List[Variant], List[str]]:
    """`parent`'s chain with one loader setting changed, per loader move that can change the result
    here; and why each other loader move does not apply."""
    variants, reasons = [], []
    for move in LOADER_MOVES:
        value, why = _loader_change(move, setting)
        if value is None:
            reasons.append(why)
            continue
        change = f"set loader.{move}={json.dumps(value)}"
        variants.append(Variant(NAME_SEPARATOR.join((parent.name, move)), (*parent.moves, move),
                                (*parent.changes, change), parent.chain, parent.draws_per_batch, ((move, value),)))
    return variants, reasons


def loader_parent(variants: Sequence[Variant]) -> Variant:
    """The chain loader moves build on: the most-moved variant a host without a device can run
    (the stack with the late cast, when there is one)."""
    host = [v for v in variants if not v.needs_device and not v.loader]
    return max(host, key=lambda v: (len(v.moves), LATE_CAST in v.moves))


def explore(name: str, chain: Chain, setting: Optional[LoaderSetting] = None,
            source: Optional[SampleSource] = None, device: str = HOST_DEVICE) -> Exploration:
    """The base chain and every distinct variant of the ladder (see the module docstring); with a
    `setting`, also the loader moves on top of the most-moved host chain. `source` (the dataset's
    first sample) lets the decode moves skip a dataset they cannot serve; `device` is where the
    on_device steps will run (gpu_decoder names it)."""
    functions = move_functions(source, device)
    variants = [Variant(name, (), (), chain)]
    seen = {variants[0].key()}
    for moves in _ladder(chain, functions):
        done = _apply(chain, moves, functions)
        if done is None:
            continue
        variant = Variant(NAME_SEPARATOR.join((name, *moves)), moves, done.changes, done.chain, done.draws_per_batch)
        if variant.key() not in seen:
            seen.add(variant.key())
            variants.append(variant)
    not_applied = [done.reason for done in (functions[m](chain) for m in MOVES) if not done.changes]
    if setting is not None:
        on_loader, reasons = loader_variants(loader_parent(variants), setting)
        variants += on_loader
        not_applied += reasons
    return Exploration(tuple(variants), tuple(not_applied))


def ladder_of(variant: Variant, variants: Sequence[Variant]) -> List[Variant]:
    """The variants whose moves are the prefixes of `variant`'s, shortest first, ending with it:
    the steps of the waterfall from the base chain (moves ()) to it."""
    by_moves = {v.moves: v for v in variants}
    return [by_moves[variant.moves[:k]] for k in range(len(variant.moves) + 1) if variant.moves[:k] in by_moves]
