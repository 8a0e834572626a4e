"""The moves that rearrange a chain's own steps: crop_first, fast, per_batch, and the tails that run
after the host-to-device copy, late_cast and to_device (pipebench.explore.variants lists them all)."""

from typing import Callable, List, Optional, Tuple

from pipebench.explore.chain import (
    LATE_CAST,
    TO_DEVICE,
    Chain,
    Moved,
    Node,
    StepArguments,
    short_name,
    target,
    with_target,
)
from pipebench.pipeline.movement import Movement, accepted_kinds, declared_movement

# Casts to float in [0, 1] that Normalize may fuse with (how each reads its input), and the fused form.
FUSED_CASTS = {"torchvision.transforms.ToTensor": "from_pil", "torchvision.transforms.v2.ToTensor": "from_pil",
               "pipebench.transforms.cast.ToFloat": "tensor", "torchvision.transforms.v2.ToDtype": "to_dtype"}
NORMALIZES = ("torchvision.transforms.Normalize", "torchvision.transforms.v2.Normalize")
NORMALIZE_UINT8 = "pipebench.transforms.cast.NormalizeUint8"
PIL_TO_TENSOR = "torchvision.transforms.PILToTensor"


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


def _fused_cast(cast: Node, normalize: Node) -> Optional[Tuple[Node, ...]]:
    """The fused form of a cast to float in [0, 1] then Normalize, or None when they are not that pair."""
    kind = FUSED_CASTS.get(target(cast))
    normalizing, casting = StepArguments.of(normalize), StepArguments.of(cast)
    if kind is None or target(normalize) not in NORMALIZES or normalizing.inplace:
        return None
    if kind == "to_dtype" and not (casting.scale and str(StepArguments.of(casting.dtype).path) == "torch.float32"):
        return None
    fused = {"_target_": NORMALIZE_UINT8, "mean": normalizing.mean, "std": normalizing.std}
    return (with_target({}, PIL_TO_TENSOR), fused) if kind == "from_pil" else (fused,)


def _fastest(node: Node) -> Tuple[Node, Optional[Movement]]:
    """The node after following its fast forms to the last (a form naming itself, or a loop, stops it)."""
    seen = {target(node)}
    movement = declared_movement(node)
    while movement is not None and movement.fast_form and movement.fast_form not in seen:
        node = with_target(node, movement.fast_form)
        seen.add(target(node))
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
            if target(replaced) != target(node):
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
        moved.insert(0, with_target(node, movement.batch_form))
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


def keeps_draws(movement: Movement) -> bool:
    """Its batch form keeps the per-sample distribution: not random, or one draw a sample."""
    return not movement.random or movement.batch_draws_per_sample


def device_tail(chain: Chain, wanted: Callable[[Movement], bool], what: str) -> Tuple[Chain, Tuple[str, ...], str]:
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
        if movement is None or not wanted(movement) or not keeps_draws(movement):
            stop = f"{short_name(per_batch_steps[-1])} (per batch) is not {what}"
            break
        node = per_batch_steps.pop()
        moved.insert(0, node)
        changes.insert(0, f"run {short_name(node)} after the host-to-device copy")
    while not per_batch_steps and per_sample_steps:
        node = per_sample_steps[-1]
        movement = declared_movement(node)
        if movement is None or not movement.batch_form or not wanted(movement) or movement.crop \
                or not keeps_draws(movement):
            stop = f"{short_name(node)} is a crop, which shrinks the sample before the copy" \
                if movement is not None and movement.crop else f"{short_name(node)} is not {what} with a batch form" + \
                (" that draws once a sample" if movement is not None and movement.random else "")
            break
        per_sample_steps.pop()
        batch = with_target(node, movement.batch_form)
        moved.insert(0, batch)
        changes.insert(0, f"run {short_name(node)} after the host-to-device copy as {short_name(batch)}")
    return Chain(tuple(per_sample_steps), tuple(per_batch_steps), (*moved, *chain.on_device)), tuple(changes), stop


def _tail_to_device(chain: Chain, move: str, wanted: Callable[[Movement], bool], what: str) -> Moved:
    """Move the trailing run of steps that `wanted` accepts to on_device (device_tail)."""
    moved, changes, stop = device_tail(chain, wanted, what)
    if not changes:
        return Moved(chain, reason=f"{move}: the last step, {stop}" if stop else f"{move}: the chain is empty")
    return Moved(moved, changes)


def late_cast(chain: Chain) -> Moved:
    """Keep the batch uint8 across the worker boundary and the copy: the trailing casts run after it."""
    return _tail_to_device(chain, LATE_CAST, lambda m: m.casts, "a cast to float (declares casts)")


def any_step(movement: Movement) -> bool:
    """to_device's filter: any step may go (the batch form and draw rules still apply)."""
    return True


# How to_device's reasons call a step it would move.
BATCHABLE = "batch-able"


def to_device(chain: Chain) -> Moved:
    """Run every trailing batch-able step after the copy, on the consumer's device."""
    return _tail_to_device(chain, TO_DEVICE, any_step, BATCHABLE)

