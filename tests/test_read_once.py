"""Stored shapes read once into frozen types: a format's JSON object (datasets/json_object) and a Hydra
`_target_` node (config/target_node)."""

from dataclasses import dataclass
from typing import Optional

import pytest

from pipebench.config.target_node import TargetNode
from pipebench.datasets.json_object import from_json


@dataclass(frozen=True)
class Entry:
    name: str
    size: Optional[int] = None


def test_a_json_object_gives_its_fields_defaults_for_keys_it_lacks_and_drops_the_rest():
    assert from_json(Entry, {"name": "a.bin", "size": 3, "sha256": "ff"}) == Entry("a.bin", 3)
    assert from_json(Entry, {"name": "a.bin"}) == Entry("a.bin", None)


def test_a_json_value_that_is_no_object_or_lacks_a_field_is_refused():
    with pytest.raises(KeyError, match="name"):
        from_json(Entry, {"size": 3})
    with pytest.raises(TypeError, match="list, not an object"):
        from_json(Entry, ["a.bin", 3])


def test_a_target_node_splits_into_its_target_and_its_arguments():
    node = {"_target_": "torchvision.transforms.RandomCrop", "size": 224, "padding": 4}
    step = TargetNode.of(node)
    assert step.target == "torchvision.transforms.RandomCrop" and step.arguments == {"size": 224, "padding": 4}
    assert TargetNode.of({"size": 224}).target is None, "a node naming no target says so"
