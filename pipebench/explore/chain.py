"""The chains explore works on, and what a move makes of one: transform configs as `_target_`
nodes, the moves' names, and the variants they yield (pipebench.explore.variants builds them)."""

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from pipebench.base.extras import MissingExtra
from pipebench.base.typed_json import parse
from pipebench.config.target_node import TargetNode
from pipebench.pipeline.recipe import RECIPE_STEP

REDUCED_DECODE = "reduced_decode"
REGION_DECODE = "region_decode"
TENSOR_PATH = "tensor_path"
DECODER = "decoder"
CROP_FIRST = "crop_first"
FAST = "fast"
PER_BATCH = "per_batch"
LATE_CAST = "late_cast"
TO_DEVICE = "to_device"
GPU_DECODER = "gpu_decoder"
GPU_REGION_DECODE = "gpu_region_decode"
# Moves that stack, in the order the ladder applies them (the decode moves first, the one that decodes
# least first: see pipebench.explore.variants).
STACKED = (REGION_DECODE, TENSOR_PATH, DECODER, REDUCED_DECODE, CROP_FIRST, FAST)
# Alternative homes for the chain's tail: the collate, or after the host-to-device copy.
TAILS = (PER_BATCH, LATE_CAST, TO_DEVICE)
# What gpu_decoder and gpu_region_decode stack on: each replaces the decode and the tail, so not the decode moves.
STACKED_UNDER_GPU_DECODER = (CROP_FIRST, FAST)
# Canonical order: names list moves in it.
MOVES = (*STACKED, *TAILS, GPU_DECODER, GPU_REGION_DECODE)
# One line a move for `pipebench explore --help` (docs/explore.md says each in full); a test holds
# it to MOVES, so a new move cannot go unlisted.
MOVE_HELP = {
    REGION_DECODE: "draw the crop box from the JPEG header, decode only that region (nvImageCodec, the decode extra)",
    TENSOR_PATH: "decode_jpeg to a uint8 tensor, the PIL steps before the conversion as their v2 tensor forms",
    DECODER: "the PIL->tensor conversion becomes decode_jpeg on the file's bytes",
    REDUCED_DECODE: "decode the JPEG at reduced size in a first step that resizes down",
    CROP_FIRST: "a crop ahead of the pointwise steps and the PIL->tensor conversion",
    FAST: "each step with a declared fast_form replaced by it",
    PER_BATCH: "trailing steps with a batch_form move into the collate",
    LATE_CAST: "steps that cast to float run after the host-to-device copy (the batch crosses as uint8)",
    TO_DEVICE: "every trailing batch-able step runs after the copy, on the consumer's device",
    GPU_DECODER: "workers read JPEG bytes; the batch is decoded and cropped on the device (nvJPEG)",
    GPU_REGION_DECODE: "workers read JPEG bytes and draw the crop box; only the boxes are decoded on the device "
                       "(nvImageCodec)",
}
# Moves that change pixels a little by design (another decode): equivalence compares their images.
DECODE_MOVES = (REDUCED_DECODE, TENSOR_PATH, REGION_DECODE)
# Moves whose gain needs an accelerator: on a host without one they are generated and checked
# (on the CPU) but not measured, as the host CPU would do the work the device is for.
DEVICE_MOVES = (TO_DEVICE, GPU_DECODER, GPU_REGION_DECODE)
NAME_SEPARATOR = "+"

Node = Mapping[str, Any]


def class_name(target: str) -> str:
    """`torchvision.transforms.RandomCrop` -> `RandomCrop`."""
    return str(target).rsplit(".", 1)[-1]


def target(node: Node) -> str:
    """The dotted path a node builds (its `_target_`), as text."""
    return str(TargetNode.of(node).target)


@dataclass(frozen=True)
class StepArguments:
    """The arguments of a step that the moves read, each None or empty where the node has none (a
    move builds its replacement from the whole node, so every other argument is kept)."""

    # A resize's or crop's output size: an int or [h, w].
    size: Any = None
    # Where a step after the copy runs.
    device: str = ""
    # A recipe's own step (RECIPE_STEP): the class it holds.
    step: str = ""
    # Normalize's figures, and its switch that rules out the fused form.
    mean: Any = None
    std: Any = None
    inplace: bool = False
    # ToDtype's: a cast to float in [0, 1] scales, to a dtype named by a `hydra.utils.get_object` node,
    # whose `path` is the dotted path of the object it names.
    scale: bool = False
    dtype: Mapping[str, Any] = field(default_factory=dict)
    path: str = ""

    @classmethod
    def of(cls, node: Node) -> "StepArguments":
        return parse(cls, TargetNode.of(node).arguments)


def short_name(node: Node) -> str:
    """A node's class name (class_name of its `_target_`); a recipe's own step by the class it holds."""
    if target(node) == RECIPE_STEP and StepArguments.of(node).step:
        return f"{StepArguments.of(node).step} (the recipe's own object)"
    return class_name(target(node))


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
    """The base chain first, then its variants; `not_applied` says why each inapplicable move is, and
    `missing` names the moves among them that would apply here but for a library not installed."""

    variants: Tuple[Variant, ...]
    not_applied: Tuple[str, ...] = field(default=())
    missing: Tuple[MissingExtra, ...] = field(default=())

    @property
    def base(self) -> Variant:
        return self.variants[0]


def with_target(node: Node, path: str) -> Dict[str, Any]:
    """The node with another class and the same arguments (a move's replacement for a step)."""
    return {**node, "_target_": path}

