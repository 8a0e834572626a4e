"""A Hydra `_target_` node (a dataset, a chain's step) read once into what it builds and with what.

Hydra's `instantiate` takes the node as a mapping, so the chains stay mappings in the job's spec; a
reader that asks which class a node names, or with which arguments, asks this type. Imports nothing
heavy (no Hydra), so a catalogue transform in a spawned worker may import it.
"""

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["TargetNode"]


@dataclass(frozen=True)
class TargetNode:
    """A node's `_target_` (the dotted path it builds; None where it names none) and its other keys,
    the arguments the target is called with."""

    target: Any
    arguments: Mapping[str, Any]

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> "TargetNode":
        return cls(node.get("_target_"), {key: value for key, value in node.items() if key != "_target_"})
