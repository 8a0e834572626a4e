"""Stored shapes read once into frozen types: a format's JSON object (base/typed_json) and a Hydra
`_target_` node (config/target_node)."""

from dataclasses import dataclass
from typing import Optional

import pytest

from pipebench.config.target_node import TargetNode
from pipebench.base.typed_json import parse


@dataclass(frozen=True)
class Entry:
    name: str
    size: Optional[int] = None


def test_a_json_object_gives_its_fields_defaults_for_keys_it_lacks_and_drops_the_rest():
    assert parse(Entry, {"name": "a.bin", "size": 3, "sha256": "ff"}) == Entry("a.bin", 3)
    assert parse(Entry, {"name": "a.bin"}) == Entry("a.bin", None)


def test_a_json_value_that_is_no_object_or_lacks_a_field_is_refused():
    with pytest.raises(KeyError, match="Entry lacks name"):
        parse(Entry, {"size": 3})
    with pytest.raises(TypeError, match="list, not an object"):
        parse(Entry, ["a.bin", 3])


def test_a_target_node_splits_into_its_target_and_its_arguments():
    node = {"_target_": "torchvision.transforms.RandomCrop", "size": 224, "padding": 4}
    step = TargetNode.of(node)
    assert step.target == "torchvision.transforms.RandomCrop" and step.arguments == {"size": 224, "padding": 4}
    assert TargetNode.of({"size": 224}).target is None, "a node naming no target says so"
