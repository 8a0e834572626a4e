"""How a transform may move in a chain: the small protocol `pipebench explore` reads.

A transform class declares `movement = Movement(...)`: which inputs it accepts (PIL images,
tensors or both), whether it converts between them, whether it is a crop, whether it is
pointwise (a crop commutes with it), whether it is random, and its per-batch and faster
forms (a reduced-size decode among them, and the uint8 tensor form of the tensor path); a
PIL->tensor conversion may name the decoder that replaces it, and a step that turns integer
pixels into float says so (`casts`), so it may run after the host-to-device copy.
torchvision's classes (v1 and v2) cannot carry the attribute, so `TORCHVISION_MOVEMENT` declares
them, keyed by `_target_`. A transform that declares nothing never moves, and nothing moves past it.
"""

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Iterable, Mapping, Optional, Union

from pipebench.base.errors import ConfigError
from pipebench.config.target_node import TargetNode

PIL = "pil"
TENSOR = "tensor"
KINDS = (PIL, TENSOR)
# The attribute a transform class declares its Movement under.
MOVEMENT_ATTR = "movement"

Form = Union[None, str, type]


def target_of(form: Form) -> Optional[str]:
    """A class or a dotted path, as the `_target_` string a config node names it by."""
    if form is None or isinstance(form, str):
        return form
    return f"{form.__module__}.{form.__qualname__}"


@dataclass(frozen=True)
class Movement:
    """What a transform declares about itself. Forms are classes or `_target_` strings; they take
    the same keyword arguments as the transform itself."""

    # Input kinds it accepts: a subset of KINDS.
    accepts: FrozenSet[str]
    # The kind it returns when it converts (PILToTensor: TENSOR); None: the kind it was given.
    returns: Optional[str] = None
    # Output is a sub-rectangle of the input, pixel values untouched (so it may move earlier).
    crop: bool = False
    # Each output pixel depends only on the same input pixel, so crop-then-this equals
    # this-then-crop and a crop may move ahead of it. A neighbourhood op (a dilation) is not.
    pointwise: bool = False
    # Draws from an RNG: an equivalent variant must give the same distribution, not the same values.
    random: bool = False
    # The same computation on a [B, ...] batch, for the collate.
    batch_form: Form = None
    # A faster transform that computes the same thing.
    fast_form: Form = None
    # The same step taking the undecoded JPEG and decoding it at a reduced size (DCT scaling) when
    # its output allows; pixels differ a little, so explore calls the result `close`.
    draft_form: Form = None
    # The same step on the uint8 [C, H, W] tensor a JPEG decodes to (torchvision.io.decode_jpeg), for
    # the tensor path; on a PIL->tensor conversion, what is left of it once the decode gives a tensor.
    tensor_form: Form = None
    # The batch form makes one random draw per sample (not one per batch), so moving it into the
    # collate or onto the device keeps the per-sample distribution.
    batch_draws_per_sample: bool = False
    # It turns integer pixels into float (colour conversion, scaling): the batch is 4x smaller
    # before it, so running it after the host-to-device copy cuts the bytes that cross.
    casts: bool = False
    # A PIL->tensor conversion: the transform that reads the file itself and decodes straight to
    # the same uint8 tensor (same arguments; the decoder move swaps it in).
    decoder_form: Form = None
    # A crop that may come first after the decode: the same step taking the undecoded JPEG, drawing
    # its box from the header size with its own sampler and decoding only that box (region_decode).
    region_form: Form = None

    def __post_init__(self):
        accepts = frozenset([self.accepts] if isinstance(self.accepts, str) else self.accepts)
        unknown = sorted(accepts.union([self.returns] if self.returns else []).difference(KINDS))
        if unknown or not accepts:
            raise ValueError(f"Movement: accepts/returns must be drawn from {KINDS}, got {sorted(accepts)}, "
                             f"{self.returns!r}")
        object.__setattr__(self, "accepts", accepts)
        for name in FORM_FIELDS:
            object.__setattr__(self, name, target_of(getattr(self, name)))


# Movement's fields that name another transform, stored as `_target_` strings.
FORM_FIELDS = ("batch_form", "fast_form", "draft_form", "tensor_form", "decoder_form", "region_form")
BOTH = frozenset(KINDS)
PIL_ONLY = frozenset([PIL])
TENSOR_ONLY = frozenset([TENSOR])


def _random_crop(step: TargetNode) -> Movement:
    # Padding fills new pixels before later pointwise steps would have changed them (a fill of 0
    # becomes 128 after RGB->YUV), so a padding RandomCrop is not a pure crop.
    pads = bool(step.arguments.get("padding")) or bool(step.arguments.get("pad_if_needed"))
    return Movement(accepts=BOTH, crop=not pads, random=True, batch_form=None if pads else BATCH_RANDOM_CROP,
                    batch_draws_per_sample=True, tensor_form=None if pads else V2 + "RandomCrop",
                    region_form=_region_form(step))


# The catalogue's decoder: torchvision.io.decode_jpeg on the file's bytes (pipebench.transforms.decode).
DECODE_JPEG = "pipebench.transforms.decode.DecodeJpeg"
# RandomCrop's batch form: one window a sample, drawn as RandomCrop draws it (after a batched decode).
BATCH_RANDOM_CROP = "pipebench.transforms.crop.BatchRandomCrop"
V1 = "torchvision.transforms."
V2 = "torchvision.transforms.v2."
# The catalogue's reduced-size decodes (pipebench.transforms.draft), per resizing step.
DRAFT_FORMS = {V1 + "RandomResizedCrop": "pipebench.transforms.draft.DraftRandomResizedCrop",
               V2 + "RandomResizedCrop": "pipebench.transforms.draft.DraftRandomResizedCropV2",
               V1 + "Resize": "pipebench.transforms.draft.DraftResize",
               V2 + "Resize": "pipebench.transforms.draft.DraftResizeV2"}
# The auto-augment family: random, and opaque (each draw picks among colour and geometric ops, some
# reading the whole image), so nothing moves past them and they move nowhere.
AUTO_AUGMENT = ("AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix")


# The catalogue's region decodes (pipebench.transforms.region): the crop's class name + this, per namespace.
REGION_FORMS = "pipebench.transforms.region.Region"


def _region_form(step: TargetNode) -> str:
    """The region-decoding form of a v1 or v2 crop node (RandomCrop -> RegionRandomCrop / ...V2)."""
    target = str(step.target)
    return REGION_FORMS + target.rsplit(".", 1)[1] + ("V2" if target.startswith(V2) else "")


# ToTensor's float conversion alone, for a tensor the decoder already made (pipebench.transforms.cast).
TO_FLOAT = "pipebench.transforms.cast.ToFloat"


def _v2(step: TargetNode) -> str:
    """The torchvision.transforms.v2 class of a v1 or v2 node: v2 runs its fast uint8 kernels on tensors."""
    return V2 + str(step.target).rsplit(".", 1)[1]


def _resize(step: TargetNode) -> Movement:
    # Shrinks, but interpolates neighbours: neither a crop nor pointwise. With max_size the output
    # size depends on both sides; the reduced-size decode leaves that case alone.
    draft_form = None if step.arguments.get("max_size") else DRAFT_FORMS[str(step.target)]
    return Movement(accepts=BOTH, draft_form=draft_form, tensor_form=_v2(step))


def _geometric(step: TargetNode, **declared: Any) -> Movement:
    """A step that moves or resamples pixels the same way on a PIL image and a tensor."""
    return Movement(accepts=BOTH, tensor_form=_v2(step), **declared)


def _both_namespaces(entries: Mapping[str, Any]) -> Dict[str, Any]:
    """Each entry under torchvision.transforms and torchvision.transforms.v2 (same behaviour here)."""
    return {prefix + name: entry for name, entry in entries.items() for prefix in (V1, V2)}


# torchvision.transforms (v1) and .v2 classes, keyed by `_target_`. A value is a Movement or a
# function of the config node (for declarations that depend on arguments).
TORCHVISION_MOVEMENT: Mapping[str, Union[Movement, Callable[[TargetNode], Movement]]] = {
    **_both_namespaces({
        "PILToTensor": Movement(accepts=PIL_ONLY, returns=TENSOR, pointwise=True, decoder_form=DECODE_JPEG),
        # Also scales to [0, 1]: still one pixel in, one pixel out.
        "ToTensor": Movement(accepts=PIL_ONLY, returns=TENSOR, pointwise=True, tensor_form=TO_FLOAT),
        "RandomCrop": _random_crop,
        "CenterCrop": lambda step: _geometric(step, crop=True, region_form=_region_form(step)),
        "Resize": _resize,
        # Crops a random region and resizes it: not a crop (it interpolates), random.
        "RandomResizedCrop": lambda step: _geometric(step, random=True, draft_form=DRAFT_FORMS[str(step.target)],
                                                     region_form=_region_form(step)),
        "Grayscale": Movement(accepts=BOTH, pointwise=True),
        # Flips move pixels: a crop before a flip picks a mirrored window.
        "RandomHorizontalFlip": lambda step: _geometric(step, random=True),
        "RandomVerticalFlip": lambda step: _geometric(step, random=True),
        # Contrast and saturation blend with the image's mean grey: a crop changes it, so not pointwise.
        "ColorJitter": Movement(accepts=BOTH, random=True),
        **{name: Movement(accepts=BOTH, random=True) for name in AUTO_AUGMENT},
    }),
    # v2 only: ToImage wraps a PIL image or a tensor as a uint8 tv_tensors.Image (which v2 transforms
    # treat like the plain uint8 tensor the decoder returns).
    V2 + "ToImage": Movement(accepts=BOTH, returns=TENSOR, pointwise=True, tensor_form=V2 + "ToImage",
                             decoder_form=DECODE_JPEG),
    # Each takes a [..., C, H, W] tensor, so it is its own batch form (on a uint8 batch too); v2's ToDtype
    # converts, and with scale=True rescales.
    **{target: Movement(accepts=TENSOR_ONLY, pointwise=True, casts=True, batch_form=target)
       for name in ("ConvertImageDtype", "Normalize") for target in (V1 + name, V2 + name)},
    V2 + "ToDtype": Movement(accepts=TENSOR_ONLY, pointwise=True, casts=True, batch_form=V2 + "ToDtype"),
}


def _locate(target: str) -> Any:
    """The object a dotted `_target_` names (module, then attributes), as Hydra resolves it.

    importlib rather than hydra.utils: catalogue transforms import this module, and workers
    started by spawn should not pay for importing Hydra.
    """
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and not (module + ".").startswith(exc.name + "."):
                raise  # the module exists but imports something missing: say that, not "not found"
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"no module found in {target!r}")


# torchvision steps that hold other steps or a user's function: whether they take a tensor is up to
# what they hold, so the library's word for the class says nothing.
CONTAINERS = ("Compose", "RandomApply", "RandomChoice", "RandomOrder", "Lambda")


def library_tensor_form(target: str) -> Optional[str]:
    """The torchvision.transforms.v2 class that runs a torchvision step on a uint8 tensor, as the library
    itself says: every v2 Transform takes tensors (the point of v2), and a v1 transform takes them when
    it is a torch.nn.Module (v1's tensor-capable, scriptable transforms; PIL-only ones such as
    ToTensor are plain classes) with a v2 namesake. None for anything else."""
    if not target.startswith(V1) or "." in target[len(V2 if target.startswith(V2) else V1):]:
        return None
    name = target.rsplit(".", 1)[1]
    if name in CONTAINERS:
        return None
    try:
        v2_class = _locate(V2 + name)
        base = _locate(V2 + "Transform")
        if not (isinstance(v2_class, type) and issubclass(v2_class, base)):
            return None
        if not target.startswith(V2):
            import torch  # only here: torchvision already imported it

            v1_class = _locate(target)
            if not (isinstance(v1_class, type) and issubclass(v1_class, torch.nn.Module)):
                return None
    except (ImportError, AttributeError):
        return None
    return V2 + name


def declared_movement(node: Mapping[str, Any]) -> Optional[Movement]:
    """The Movement a `_target_` node declares (registry first, then the class attribute), or None.

    A registry entry that declares no tensor form gets the library's (library_tensor_form), unless it
    converts kinds (PILToTensor's tensor form is deliberately none: the decode already gives the tensor).
    A torchvision step outside the registry that the library says takes tensors is declared random (it
    may draw: the guard then tests its distribution), opaque (not a crop, not pointwise: nothing moves
    past it) and tensor-capable, so the tensor path can carry it."""
    step = TargetNode.of(node)
    target = step.target
    entry = TORCHVISION_MOVEMENT.get(target)
    if entry is not None:
        declared = entry if isinstance(entry, Movement) else entry(step)
        if declared.tensor_form or declared.returns or PIL not in declared.accepts:
            return declared
        form = library_tensor_form(target)
        return dataclasses.replace(declared, tensor_form=form) if form else declared
    form = library_tensor_form(str(target))
    if form is not None:
        return Movement(accepts=BOTH, random=True, tensor_form=form)
    try:
        declared = getattr(_locate(target), MOVEMENT_ATTR, None)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{target}: cannot import it to read its movement: {str(exc).splitlines()[0]}") from exc
    if declared is not None and not isinstance(declared, Movement):
        raise ConfigError(f"{target}.{MOVEMENT_ATTR} must be a pipebench.pipeline.movement.Movement, got {declared!r}")
    return declared


def accepted_kinds(movements: Iterable[Optional[Movement]]) -> Iterable[Optional[FrozenSet[str]]]:
    """For each position of a chain, the kinds that may arrive there (None when unknown).

    A declared step can only be reached by kinds it accepts (the chain as given runs), and
    passes on its output kind (what it returns, else what it was given); after an undeclared step the
    kind is unknown until the next declared step.
    """
    kinds: Optional[FrozenSet[str]] = None
    for movement in movements:
        if movement is not None:
            kinds = movement.accepts if kinds is None else kinds & movement.accepts
        yield kinds
        if movement is None or kinds is None:
            kinds = None
        elif movement.returns:
            kinds = frozenset([movement.returns])
