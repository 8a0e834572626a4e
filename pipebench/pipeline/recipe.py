"""A recipe given as one object: a per-sample `_target_` that returns a Compose (torchvision v1 or v2)
or any object exposing its steps as a list (`transforms`, as timm's and most training scripts'
factories return) is opened into one node a step, so each step is timed on its own row and explore
moves the steps as it moves a list written in YAML.

A step becomes a plain `_target_` node with the arguments read back from it (its constructor's
parameters, as attributes: export_nodes.object_node) when the rebuilt step is the same; otherwise it
stays the recipe's own object (`recipe_step`: the factory's k-th step), timed on its own row but
declaring nothing, so explore leaves it in place and moves nothing across it, and a note says why.
An object that is not a plain sequence of steps (torchvision's RandomApply, RandomChoice, RandomOrder
draw which steps run) is kept whole, one row, and a note says why.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.base.errors import ConfigError
from pipebench.config.target_node import TargetNode
from pipebench.pipeline.export_nodes import object_node
from pipebench.pipeline.instantiate import instantiate_node

# The attribute a recipe object lists its steps under (torchvision's Compose, timm's, most factories').
STEPS_ATTR = "transforms"
# Objects with a `transforms` list that do not run all of it in order: opening them would change the chain.
NOT_SEQUENTIAL = ("RandomApply", "RandomChoice", "RandomOrder")
# The node a step that cannot be written back as arguments becomes: the recipe's own k-th step.
RECIPE_STEP = "pipebench.pipeline.recipe.recipe_step"
Node = Mapping[str, Any]


@dataclass(frozen=True)
class Opened:
    """Per-sample nodes with every recipe opened into its steps, and a note per recipe kept whole."""

    nodes: Tuple[Node, ...]
    notes: Tuple[str, ...] = ()


def recipe_step(recipe: Any, index: int, step: Optional[str] = None) -> Any:
    """The recipe object's `index`-th step (Hydra builds the recipe from its node first). `step`, the
    class it had when opened, is checked: a factory edited since then fails here, not in a wrong row."""
    found = list(getattr(recipe, STEPS_ATTR))[index]
    if step is not None and type(found).__name__ != step:
        raise ConfigError(f"recipe step {index} is now a {type(found).__name__}, not the {step} it was when the "
                          "recipe was opened: the factory changed, so rerun explore with --fresh")
    return found


def step_node(recipe_node: Node, step: Any, index: int) -> Tuple[Dict[str, Any], str]:
    """(a `_target_` node that builds the same step, ""): its class and the arguments read back from its
    attributes, checked by rebuilding it; else (the recipe's own k-th step, why it is not rebuilt).
    Arguments must be plain values: a step holding other steps or objects stays the recipe's own."""
    rebuilt = object_node(step)
    if rebuilt.ok:
        return dict(rebuilt.node), ""
    return {"_target_": RECIPE_STEP, "recipe": dict(recipe_node), "index": index, "step": type(step).__name__}, \
        rebuilt.why


def _why_not_opened(built: Any) -> str:
    """Why a built object with a `transforms` attribute is not opened ("" when it is)."""
    name = type(built).__name__
    if name in NOT_SEQUENTIAL:
        return f"{name} does not run its steps in order every time, so it is timed as one step"
    steps = getattr(built, STEPS_ATTR)
    if not isinstance(steps, (list, tuple)) or not all(callable(s) for s in steps):
        return f"{name}.{STEPS_ATTR} is not a list of steps, so it is timed as one step"
    return ""


def open_recipes(nodes: Sequence[Node], where: str = "transform.per_sample") -> Opened:
    """`nodes` with each one that builds a recipe object replaced by its steps' nodes."""
    opened: List[Node] = []
    notes: List[str] = []
    for i, node in enumerate(nodes):
        target = str(TargetNode.of(node).target or "")
        built = None
        if target != RECIPE_STEP and _may_be_recipe(target):
            built = instantiate_node(node, f"{where}[{i}]")
        recipe = hasattr(built, STEPS_ATTR)
        why = _why_not_opened(built) if recipe else ""
        if why:
            notes.append(f"{where}[{i}] ({target}): {why}")
        if why or not recipe:
            opened.append(node)
            continue
        for k, step in enumerate(getattr(built, STEPS_ATTR)):
            step_opened, why = step_node(node, step, k)
            opened.append(step_opened)
            if why:
                notes.append(f"{where}[{i}] ({target}): step {k}, {type(step).__name__}, runs as the recipe's own "
                             f"object, which declares no movement (explore moves nothing across it): {why}")
    return Opened(tuple(opened), tuple(notes))


def _may_be_recipe(target: str) -> bool:
    """Worth building to look: not a torchvision step or a pipebench catalogue transform (they are steps)."""
    name = target.rsplit(".", 1)[-1]
    if target.startswith("torchvision.transforms."):
        return name == "Compose" or name in NOT_SEQUENTIAL
    return not target.startswith("pipebench.transforms.")


def emptied(recipe: Any) -> Any:
    """What stands for a dataset's recipe once pipebench's chain runs it instead: an empty list for a
    list of steps (a dataset that loops over it), else None (torchvision's "no transform")."""
    return [] if isinstance(recipe, (list, tuple)) else None


def without_recipe(dataset: Any, attr: str, empty: Any = None) -> Any:
    """The dataset with its recipe attribute set to `empty` (`emptied`'s value), so the chain pipebench
    builds is the only one that runs: the target an exported dataset is wrapped in when no constructor
    argument held its recipe."""
    setattr(dataset, attr, empty)
    return dataset
