"""The moves that replace a chain's decode: region_decode, decoder, tensor_path, reduced_decode and
gpu_decoder (pipebench.explore.variants lists them all). They read what the dataset gives (a SampleSource), so a
dataset that is not JPEG files is skipped with the reason."""

from typing import List, Optional, Sequence, Tuple

from pipebench.explore.chain import (
    DECODER,
    GPU_DECODER,
    GPU_REGION_DECODE,
    REDUCED_DECODE,
    REGION_DECODE,
    TENSOR_PATH,
    Chain,
    Moved,
    Node,
    SampleSource,
    StepArguments,
    class_name,
    short_name,
    target,
    with_target,
)
from pipebench.explore.chain_moves import BATCHABLE, any_step, device_tail, keeps_draws
from pipebench.pipeline.consumers import HOST_DEVICE
from pipebench.pipeline.movement import PIL, TENSOR, declared_movement
from pipebench.transforms.decode import decoder_note

# The catalogue's decoder: decode_jpeg on the file's bytes, to a uint8 [3, H, W] tensor (TorchCodec's,
# else torchvision's deprecated one: pipebench.transforms.decode.decoder_note says which runs here).
DECODE_JPEG = "pipebench.transforms.decode.DecodeJpeg"
# Its batched split at the copy (gpu_decoder): the file's bytes in the worker, one decode call after.
READ_JPEG_BYTES = "pipebench.transforms.decode.ReadJpegBytes"
BATCH_DECODE_JPEG = "pipebench.transforms.decode.BatchDecodeJpeg"
# gpu_region_decode's split at the copy (pipebench.transforms.region_batch): the crop's Read* form
# (bytes and box) in the worker, one nvImageCodec decode of the batch's boxes after.
READ_REGION_PREFIX = "pipebench.transforms.region_batch.Read"
BATCH_REGION_DECODE = "pipebench.transforms.region_batch.BatchRegionDecode"
# The RandomResizedCrop arguments its resize needs, which BatchRegionDecode does on the device.
RESIZE_ARGUMENTS = ("size", "interpolation", "antialias")
# The region form's own switch for a PIL resize: no PIL on the device.
PIL_RESIZE = "pil_resize"
# The device type nvJPEG needs.
CUDA = "cuda"
# PIL's name for a JPEG file (Image.format): the only format with DCT-scaled decoding.
JPEG_FORMAT = "JPEG"
# libjpeg's smallest useful DCT reduction: below twice the output size no draft can apply.
MIN_DRAFT_REDUCTION = 2


def _output_size(node: Node, image: Tuple[int, int]) -> Tuple[int, int]:
    """(w, h) a RandomResizedCrop or Resize node makes of a (w, h) image."""
    size = StepArguments.of(node).size
    sizes = [size] if isinstance(size, int) else list(size)
    if len(sizes) == 2 or "RandomResizedCrop" in target(node):
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
    decoded = with_target(conversion, movements[at].decoder_form)
    # Which decode_jpeg the catalogue's decoder runs in this process; nothing for another declared decoder.
    used = f", with {decoder_note()}" if target(decoded) == DECODE_JPEG else ""
    changes = [f"replace {short_name(conversion)} with {short_name(decoded)} (decode the JPEG file straight to a "
               f"uint8 tensor{used})"]
    if before:
        changes.append(f"move {', '.join(short_name(n) for n, _ in before)} after {short_name(decoded)}")
    new_steps = (decoded, *(n for n, _ in before), *steps[at + 1:])
    return Moved(Chain(new_steps, chain.per_batch, chain.on_device), tuple(changes))


def _batch_decode_change(device: str) -> str:
    """gpu_decoder's decode, in words, for where it will run, naming the decode_jpeg that runs there."""
    if device.startswith(CUDA):
        return (f"decode the batch on the GPU after the copy ({class_name(BATCH_DECODE_JPEG)}, nvJPEG through "
                f"{decoder_note(device)})")
    return (f"decode the batch in one call after the copy, on {device} here ({class_name(BATCH_DECODE_JPEG)}: "
            f"{decoder_note(device)}; nvJPEG where there is a CUDA device)")


def _device_crops(steps: Sequence[Node]) -> Tuple[List[Node], str]:
    """(the batch forms of the crops that lead `steps`, or [] with why they cannot run on the device):
    a crop must come first, as the decoded images differ in size until one stacks them."""
    crops: List[Node] = []
    for node in steps:
        movement = declared_movement(node)
        if movement is None or not movement.crop:
            break
        if not movement.batch_form or not keeps_draws(movement):
            lacks = "no batch form" if not movement.batch_form else "a batch form that draws once a batch"
            return [], f"{short_name(node)}, the crop after the decode, has {lacks}"
        crops.append(with_target(node, movement.batch_form))
    if not crops:
        first = f"{short_name(steps[0])} comes first" if steps else "nothing comes"
        return [], f"no crop follows the decode ({first}), so the decoded images cannot be stacked into one batch"
    return crops, ""


def gpu_decoder(chain: Chain, source: Optional[SampleSource] = None, device: str = HOST_DEVICE) -> Moved:
    """Read the JPEG file's bytes in the worker and decode the batch in one call after the copy, on
    `device` (nvJPEG on CUDA); the crop, then every later step, run there as their batch forms."""
    if skipped := _not_jpeg(GPU_DECODER, source):
        return Moved(chain, reason=skipped)
    decoded = decoder(chain, GPU_DECODER)
    if not decoded.changes:
        return decoded
    first, *steps = decoded.chain.per_sample
    if target(first) != DECODE_JPEG:
        return Moved(chain, reason=f"{GPU_DECODER}: the declared decoder, {short_name(first)}, has no batched form "
                                   f"on the device (only {class_name(DECODE_JPEG)} has)")
    crops, why = _device_crops(steps)
    if not crops:
        return Moved(chain, reason=f"{GPU_DECODER}: {why}")
    rest = Chain(tuple(steps[len(crops):]), chain.per_batch, chain.on_device)
    tail, tail_changes, stop = device_tail(rest, any_step, BATCHABLE)
    if tail.per_sample or tail.per_batch:
        return Moved(chain, reason=f"{GPU_DECODER}: {stop}, so it cannot run on the device after the decode")
    conversion = chain.per_sample[decoder_conversion(chain)]
    changes = (f"read the JPEG bytes in the worker ({class_name(READ_JPEG_BYTES)}) in place of PIL's "
               f"decode and {short_name(conversion)}", _batch_decode_change(device),
               *(f"crop on the device: {short_name(n)} as {short_name(b)}" for n, b in zip(steps, crops)),
               *tail_changes)
    on_device = ({"_target_": BATCH_DECODE_JPEG, "device": device}, *crops, *tail.on_device)
    return Moved(Chain(({"_target_": READ_JPEG_BYTES},), (), on_device), changes)


# A crop's arguments that pad: its output then reaches outside the file's pixels, which the CPU move
# meets by the full decode's fallback but a box decoded after the copy cannot.
PADDING_ARGUMENTS = ("padding", "pad_if_needed")


def gpu_region_decode(chain: Chain, source: Optional[SampleSource] = None, device: str = HOST_DEVICE,
                      unavailable: str = "") -> Moved:
    """region_decode split at the copy: the worker draws the crop's box from the JPEG header with the
    crop's own sampler and passes the file's bytes; after the copy the batch's boxes are decoded in one
    nvImageCodec call on `device` (nvJPEG on CUDA), a RandomResizedCrop's regions resized there, and
    every later step runs there as its batch form (to_device's rules)."""
    moved = region_decode(chain, source, unavailable)
    if not moved.changes:
        return Moved(chain, reason=f"{GPU_REGION_DECODE}: {moved.reason.partition(': ')[2]}")
    region, *steps = moved.chain.per_sample
    if target(region).startswith(REGION_RESIZE_CENTER_CROP):
        return Moved(chain, reason=f"{GPU_REGION_DECODE}: Resize then CenterCrop has no batched region form after the "
                                   "copy (the CPU region_decode covers it)")
    if any(region.get(key) for key in PADDING_ARGUMENTS):
        return Moved(chain, reason=f"{GPU_REGION_DECODE}: {short_name(region)} may pad (padding / pad_if_needed), and "
                                   "a padded sample has no box inside its file to decode after the copy")
    rest = Chain(tuple(steps), chain.per_batch, chain.on_device)
    tail, tail_changes, stop = device_tail(rest, any_step, BATCHABLE)
    if tail.per_sample or tail.per_batch:
        return Moved(chain, reason=f"{GPU_REGION_DECODE}: {stop}, so it cannot run on the device after the decode")
    form = class_name(target(region))
    read = {k: v for k, v in with_target(region, READ_REGION_PREFIX + form).items() if k != PIL_RESIZE}
    resized = "RandomResizedCrop" in form
    decode = {"_target_": BATCH_REGION_DECODE, "device": device,
              **({k: region[k] for k in RESIZE_ARGUMENTS if k in region} if resized else {})}
    where = "on the GPU (nvImageCodec's GPU backend, nvJPEG)" if device.startswith(CUDA) else \
        f"on {device} here (nvImageCodec's CPU backend; its GPU backend where there is a CUDA device)"
    changes = (f"read the JPEG bytes and draw the crop box from the header in the worker ({short_name(read)}, "
               f"the box by the crop's own sampler) in place of the decode and the crop",
               f"decode only the batch's boxes in one call after the copy, {where}"
               + (", then resize each region there (torchvision's tensor kernel)" if resized else ""),
               *tail_changes)
    return Moved(Chain((read,), (), (decode, *tail.on_device)), changes)


def reduced_decode(chain: Chain, source: Optional[SampleSource] = None) -> Moved:
    """Replace a first step that resizes down by its draft_form (decode the JPEG at reduced size)."""
    if skipped := _not_jpeg(REDUCED_DECODE, source):
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
    drafted = with_target(first, movement.draft_form)
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
    if skipped := _not_jpeg(TENSOR_PATH, source):
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
    moved = [with_target(n, declared_movement(n).tensor_form) for n in before]
    rest = ([with_target(conversion, left)] if left else []) + list(chain.per_sample[at + 1:])
    changes = [f"decode the JPEG with {class_name(DECODE_JPEG)} (torchvision.io.decode_jpeg, straight "
               "to a uint8 tensor) instead of PIL"]
    changes += [f"run {short_name(n)} on the tensor as {target(m).rsplit('.', 2)[-2]}.{short_name(m)}"
                for n, m in zip(before, moved)]
    if not left:
        changes.append(f"drop {short_name(conversion)} (the decoder gives the tensor)")
    elif left != target(conversion):
        changes.append(f"replace {short_name(conversion)} with {short_name(rest[0])}")
    return Moved(Chain(({"_target_": DECODE_JPEG}, *moved, *rest), chain.per_batch, chain.on_device),
                 tuple(changes))


def _to_tensor_first(chain: Chain, source: Optional[SampleSource]) -> Tuple[Moved, bool]:
    """(the chain with DecodeJpeg first: tensor_path, else the decoder move; whether its first crop
    ran on the PIL image in the chain, so a resize after it is PIL's). When neither applies to a chain
    whose conversion has no decoder (ToTensor) and steps before it, the tensor path's reason is the one
    that names the step in the way."""
    moved = tensor_path(chain, source)
    if moved.changes:
        return moved, True
    decoded = decoder(chain, REGION_DECODE)
    if decoded.changes or decoder_conversion(chain) is not None or not _conversion_at(chain):
        return decoded, False
    return moved, False


def region_decode(chain: Chain, source: Optional[SampleSource] = None, unavailable: str = "") -> Moved:
    """Decode only the box of the crop that comes first after the decode: the decode and the crop
    become the crop's region_form (pipebench.transforms.region), which draws the box from the JPEG's
    header with the crop's own sampler; the steps that ran on the PIL image run on the tensor, as
    tensor_path runs them. `unavailable`: why nvImageCodec cannot run here ("" when it can)."""
    skipped = _not_jpeg(REGION_DECODE, source)
    if skipped or unavailable:
        return Moved(chain, reason=skipped or f"{REGION_DECODE}: {unavailable}")
    decoded, pil_side = _to_tensor_first(chain, source)  # pil_side: the crop is the chain's first step
    if not decoded.changes:
        why = decoded.reason.partition(": ")[2] or "the chain does not decode a JPEG first"
        return Moved(chain, reason=f"{REGION_DECODE}: {why}")
    steps = decoded.chain.per_sample
    dropped = () if pil_side else (f"drop {short_name(chain.per_sample[decoder_conversion(chain)])} (the region "
                                   "decode gives the uint8 tensor)",)
    # The crop as the chain wrote it (tensor_path made a PIL-side crop its v2 form): its own sampler draws.
    crop = chain.per_sample[0] if pil_side else steps[1] if len(steps) > 1 else None
    movement = declared_movement(crop) if crop is not None else None
    if crop is not None and short_name(crop) == RESIZE:
        then = chain.per_sample[1] if pil_side else steps[2] if len(steps) > 2 else None
        return _resize_center_crop(chain, decoded, crop, then, dropped)
    if movement is None or not movement.region_form:
        first = f"{short_name(crop)} comes first" if crop is not None else "nothing comes"
        return Moved(chain, reason=f"{REGION_DECODE}: no crop with a region form (RandomCrop, CenterCrop, "
                                   f"RandomResizedCrop) follows the decode ({first})")
    region = with_target(crop, movement.region_form)
    if "RandomResizedCrop" in movement.region_form:
        # The region resized by torchvision's uint8 tensor kernel, not PIL's: measured here (one thread,
        # default corpus) 1.41 ms a sample against 2.45 ms with PIL (the round trip to a PIL image and
        # PIL's resize), and decode_jpeg + v2 RandomResizedCrop 1.65 ms; pixels differ by a grey level
        # from PIL's resize, as tensor_path's do, so the guard's bound judges it.
        region = {**region, "pil_resize": False}
    name = short_name(crop)
    changes = (f"decode only {name}'s box of the JPEG ({short_name(region)}: the box drawn from the header size by "
               f"{name}'s own sampler, the region decoded by nvImageCodec's CPU backend)", *dropped,
               *(c for c in decoded.changes[1:] if not c.startswith(f"run {name} ")))
    return Moved(Chain((region, *steps[2:]), chain.per_batch, chain.on_device), changes)


# Resize then CenterCrop become one region form (pipebench.transforms.region): its class, per namespace.
RESIZE = "Resize"
CENTER_CROP = "CenterCrop"
REGION_RESIZE_CENTER_CROP = "pipebench.transforms.region.RegionResizeCenterCrop"
V2_PREFIX = "torchvision.transforms.v2."


def _resize_center_crop(chain: Chain, decoded: Moved, resize: Node, then: Optional[Node],
                        dropped: Tuple[str, ...]) -> Moved:
    """region_decode of a chain whose first pixel steps are Resize then CenterCrop: one region form that
    decodes the source box the centre crop keeps (widened by the resize filter's support) and resizes it
    on the full resize's pixel grid (PIL's resample with the full scale), then crops the window; `dropped`
    is region_decode's change that drops the conversion, if any."""
    if then is None or short_name(then) != CENTER_CROP:
        after = f"{short_name(then)} follows it" if then is not None else "nothing follows it"
        return Moved(chain, reason=f"{REGION_DECODE}: Resize comes first and no CenterCrop follows it ({after}), "
                                   "so every decoded pixel is kept")
    if target(resize).startswith(V2_PREFIX) != target(then).startswith(V2_PREFIX):
        return Moved(chain, reason=f"{REGION_DECODE}: Resize and CenterCrop come from different torchvision "
                                   "namespaces (v1 and v2)")
    if StepArguments.of(resize).size is None:
        return Moved(chain, reason=f"{REGION_DECODE}: Resize has no size (size=None, max_size only)")
    suffix = "V2" if target(resize).startswith(V2_PREFIX) else ""
    region = {**{k: v for k, v in resize.items() if k != "_target_"}, "crop_size": StepArguments.of(then).size}
    region = {"_target_": REGION_RESIZE_CENTER_CROP + suffix, **region}
    steps = decoded.chain.per_sample
    moved_names = (f"run {RESIZE} ", f"run {CENTER_CROP} ", f"move {RESIZE}")
    changes = (f"decode only the source box {RESIZE} then {CENTER_CROP} keep ({short_name(region)}: the box from the "
               "header size, widened by the resize filter's support, decoded by nvImageCodec's CPU backend, resized "
               "on the full resize's pixel grid, then the crop window cut)", *dropped,
               *(c for c in decoded.changes[1:] if not c.startswith(moved_names)))
    return Moved(Chain((region, *steps[3:]), chain.per_batch, chain.on_device), changes)


def pixel_prefixes(move: str, chain: Chain) -> Tuple[int, int]:
    """How many leading per-sample steps of the chain, and of the chain `move` makes of it, produce the
    8-bit image the move changes (compared in grey levels before any float conversion)."""
    if move == TENSOR_PATH:
        at = _conversion_at(chain)
        return at, at + 1
    if move == REGION_DECODE:  # through the region step and, after a PIL-side crop, the conversion
        decoded, pil_side = _to_tensor_first(chain, None)
        # Resize then CenterCrop: two of the chain's steps are one region step in the variant.
        first = region_decode(chain).chain.per_sample[:1]
        merged = int(bool(first) and target(first[0]).startswith(REGION_RESIZE_CENTER_CROP))
        if pil_side:
            at = _conversion_at(chain)
            return at, at - merged
        before = decoder_conversion(chain)
        ours = before + 1 if before else 2
        return ours + merged, ours - 1
    return 1, 1

