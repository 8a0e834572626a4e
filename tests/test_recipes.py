"""A recipe given as one object (pipebench.pipeline.recipe): opened into its steps, each timed on its
own row, moved by explore like a YAML list; an object that cannot be opened is one row with a note."""

import dataclasses

import pytest
import torch
from conftest import compose_spec

from pipebench.base.errors import ConfigError
from pipebench.explore.chain import REDUCED_DECODE, REGION_DECODE, TENSOR_PATH, Chain, SampleSource
from pipebench.explore.variants import explore
from pipebench.measure.setup import seed_everything
from pipebench.pipeline.build import build_pipeline, build_transforms
from pipebench.pipeline.recipe import RECIPE_STEP, open_recipes

JPEG = SampleSource("JPEG", (533, 800))


@pytest.mark.parametrize("factory, names", [
    ("build_v1", ["RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]),
    ("build_v1_jitter", ["RandomResizedCrop", "RandomHorizontalFlip", "ColorJitter", "ToTensor", "Normalize"]),
    ("build_v2", ["RandomResizedCrop", "RandomHorizontalFlip", "ColorJitter", "ToImage", "ToDtype", "Normalize"]),
])
def test_a_factorys_compose_opens_into_plain_nodes(factory, names):
    opened = open_recipes([{"_target_": f"recipe_kit.{factory}", "size": 64}])
    assert [n["_target_"].rsplit(".", 1)[1] for n in opened.nodes] == names and not opened.notes
    assert opened.nodes[0]["size"] == [64, 64]
    namespace = "torchvision.transforms.v2." if factory == "build_v2" else "torchvision.transforms."
    assert all(n["_target_"].startswith(namespace) for n in opened.nodes), "public names, as the registry keys them"


@pytest.mark.parametrize("factory", ["build_v1", "build_v1_jitter", "build_v2"])
def test_opened_steps_compute_what_the_compose_computes(factory, tmp_path):
    import recipe_kit
    from PIL import Image

    image = Image.new("RGB", (120, 90), (30, 160, 220))
    steps = build_transforms(open_recipes([{"_target_": f"recipe_kit.{factory}", "size": 48}]).nodes, "t")
    seed_everything(3)
    ours = image
    for step in steps:
        ours = step(ours)
    seed_everything(3)
    assert torch.equal(ours, getattr(recipe_kit, factory)(48)(image))


def test_each_step_is_timed_on_its_own_row():
    spec = compose_spec(["transform=imagenet", "dataset.length=8", "loader.batch_size=4"])
    spec = dataclasses.replace(spec, per_sample=({"_target_": "recipe_kit.build_v2", "size": 64},))
    _, instrumented, _ = build_pipeline(spec)
    assert [s.name for s in instrumented.steps[2:]] == ["RandomResizedCrop", "RandomHorizontalFlip", "ColorJitter",
                                                        "ToImage", "ToDtype", "Normalize"]


@pytest.mark.parametrize("factory", ["build_v2", "build_v1_jitter"])
def test_explore_moves_the_steps_of_a_recipe_object(factory):
    chain = Chain(open_recipes([{"_target_": f"recipe_kit.{factory}"}]).nodes)
    found = explore("recipe", chain, source=JPEG, region_problem="")
    moves = {v.moves for v in found.variants}
    assert (TENSOR_PATH,) in moves and (REGION_DECODE,) in moves, found.not_applied


def test_a_step_without_readable_arguments_stays_the_recipes_own_object():
    opened = open_recipes([{"_target_": "recipe_kit.build_with_opaque"}])
    assert [n["_target_"] for n in opened.nodes][1] == RECIPE_STEP
    built = build_transforms(opened.nodes, "t")
    assert type(built[1]).__name__ == "Opaque", "its row is named by its class"
    assert len(opened.notes) == 1 and "step 1, Opaque" in opened.notes[0] and "`gain`" in opened.notes[0]


def test_the_moves_an_opaque_step_blocks_name_it():
    opened = open_recipes([{"_target_": "recipe_kit.build_opaque_before_to_tensor"}])
    found = explore("recipe", Chain(opened.nodes), source=JPEG, region_problem="")
    reasons = {r.partition(": ")[0]: r for r in found.not_applied}
    for move in (REGION_DECODE, TENSOR_PATH):
        assert "Opaque (the recipe's own object) runs on the PIL image before ToTensor" in reasons[move], reasons[move]
    assert (REDUCED_DECODE,) in {v.moves for v in found.variants}, "a move that crosses no opaque step still applies"


def test_a_recipe_step_whose_factory_changed_fails_with_one_line():
    recipe = {"_target_": "recipe_kit.build_with_opaque"}
    with pytest.raises(ConfigError, match="now a CenterCrop, not the Resize"):
        build_transforms([{"_target_": RECIPE_STEP, "recipe": recipe, "index": 0, "step": "Resize"}], "t")


def test_an_object_it_cannot_open_is_one_row_with_the_reason():
    opened = open_recipes([{"_target_": "recipe_kit.NotARecipe"}])
    assert len(opened.nodes) == 1 and len(opened.notes) == 1
    assert "NotARecipe" in opened.notes[0] and "not a list of steps" in opened.notes[0]
    applied = open_recipes([{"_target_": "torchvision.transforms.RandomApply",
                             "transforms": [{"_target_": "torchvision.transforms.RandomHorizontalFlip"}]}])
    assert len(applied.nodes) == 1 and "in order" in applied.notes[0]
