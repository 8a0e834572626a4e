"""A watched loader's pipeline as pipebench configs: the dataset, the recipe and the loader as `_target_`
nodes and settings, with what could not be written named and why.

The dataset: a torchvision `ImageFolder` read as by default is pipebench's own `dataset=image_folder`
on the same root; any other is its own class with the arguments it was built with (recorded by
`built_with`, else read back from its attributes), the argument that carried the recipe emptied,
since pipebench's chain runs the recipe itself. A `Subset` is written as the dataset it selects
from, with a note (a list of indices would be as long as the split). The recipe: each step rebuilt
from its attributes (`export_nodes.value_node`), one that cannot be left out and named. The loader:
its settings, as `loader.*` and `workers`. The consumer: the script's own step as attach measured
it, emulated (`with_measured_step`), so a run of the export feeds a step as long as the script's.
"""

import pathlib
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler, default_collate

from pipebench.attach.built_with import BuiltWith
from pipebench.attach.watch_chain import (RECIPE_ATTRS, callable_name, open_recipe, recipe_holders,
                                          shared_recipe, subset_base)
from pipebench.config.specs import EMULATED
from pipebench.measure.steps import NS_PER_MS
from pipebench.pipeline.export_nodes import NodeOrWhy, attribute_arguments, importable_why, public_target, value_node
from pipebench.pipeline.recipe import emptied

__all__ = ["ExportedPipeline", "export_pipeline", "measured_consumer", "with_measured_step"]

# pipebench's own folder dataset, the target a torchvision ImageFolder maps to.
IMAGE_FOLDER_TARGET = "pipebench.datasets.image_folder.ImageFolderDataset"
# The wrapper that empties a dataset's recipe attribute when no constructor argument carried it.
WITHOUT_RECIPE = "pipebench.pipeline.recipe.without_recipe"
# torchvision's file loaders that read a file as ImageFolder does by default (PIL, converted to RGB).
DEFAULT_FILE_LOADERS = ("default_loader", "pil_loader")
# The arguments ImageFolder may be given that pipebench's folder dataset reads the same way when
# left at these values (anything else keeps the torchvision class).
IMAGE_FOLDER_DEFAULTS = {"target_transform": None, "is_valid_file": None, "allow_empty": False}
# A normal distribution's standard deviation from its interquartile range (IQR = 1.349 sigma): the
# emulated consumer's `normal` spread from a robust reading of the script's step times.
IQR_PER_SIGMA = 1.349


@dataclass(frozen=True)
class ExportedPipeline:
    """One loader's configs: `dataset` (None when it could not be written), the recipe's per-sample
    nodes, the `loader.*` settings and `workers`, and a note per part left out or changed."""

    dataset: Optional[Dict[str, Any]]
    per_sample: Tuple[Any, ...]
    loader: Dict[str, Any]
    workers: int
    notes: Tuple[str, ...] = ()
    # The script's own step as an emulated consumer (`consumer.*`), where attach measured one.
    consumer: Optional[Dict[str, Any]] = None


def _image_folder(dataset: Any, given: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """pipebench's image_folder on the same root, for a torchvision ImageFolder that reads its files as
    by default."""
    cls = type(dataset)
    if (cls.__name__ != "ImageFolder" or cls.__module__ != "torchvision.datasets.folder"
            or getattr(getattr(dataset, "loader", None), "__name__", None) not in DEFAULT_FILE_LOADERS
            or getattr(dataset, "target_transform", None) is not None
            or any(given.get(name, default) != default for name, default in IMAGE_FOLDER_DEFAULTS.items())):
        return None
    return {"_target_": IMAGE_FOLDER_TARGET, "path": str(pathlib.Path(dataset.root).resolve()),
            "num_classes": len(dataset.classes), "seed": 0, "cache": "warm"}


def _dataset_node(dataset: Any, built_with: Optional[BuiltWith], notes: List[str]) -> Optional[Dict[str, Any]]:
    """The dataset's node, or None with a note saying why not."""
    name = type(dataset).__name__
    why = importable_why(type(dataset))
    if why:
        notes.append(f"dataset {name}: not exported: {why}")
        return None
    given = built_with.arguments(dataset) if built_with is not None else None
    mapped = _image_folder(dataset, given or {})
    if mapped is not None:
        notes.append(f"dataset {name}: written as pipebench's dataset=image_folder on the same root (the "
                     "same files and folder labels; its lazy open gives the decode its own row)")
        return mapped
    attr = next((name for name in RECIPE_ATTRS if getattr(dataset, name, None) is not None), None)
    recipe = None if attr is None else getattr(dataset, attr)
    if given is None:
        given, why = attribute_arguments(dataset)
        if given is None:
            notes.append(f"dataset {name}: not exported: it was built before pipebench was watching, and {why}")
            return None
        notes.append(f"dataset {name}: built before pipebench was watching: its arguments are read back from its "
                     "attributes of the same names; check them")
    arguments: Dict[str, Any] = {}
    carried = False
    for key, value in given.items():
        if attr is not None and (value is recipe or key in RECIPE_ATTRS):
            arguments[key] = emptied(value)
            carried = carried or value is recipe
            continue
        written: NodeOrWhy = value_node(value)
        if not written.ok:
            notes.append(f"dataset {name}: not exported: its argument `{key}`: {written.why}")
            return None
        arguments[key] = written.node
    node = {"_target_": public_target(type(dataset)), **arguments}
    if attr is not None and not carried:
        notes.append(f"dataset {name}: its recipe `{attr}` was set by the dataset itself, not given as an "
                     f"argument: the config wraps it in without_recipe, which empties `{attr}` after building it")
        node = {"_target_": WITHOUT_RECIPE, "dataset": node, "attr": attr, "empty": emptied(recipe)}
    return node


def _recipe_source(dataset: Any, notes: List[str]) -> Any:
    """The dataset whose recipe is written: itself, or the first of a ConcatDataset's datasets where
    they hold one recipe (where they differ, the dataset itself, which holds none, with a note)."""
    holders = recipe_holders(dataset)
    if len(holders) == 1:
        return holders[0]
    found, shared = shared_recipe(holders)
    if found and shared:
        return found[0][0]
    notes.append(f"transform: the {len(holders)} datasets of {type(dataset).__name__} hold different recipes (or "
                 "some none): no one transform config is theirs")
    return dataset


def _recipe_nodes(dataset: Any, notes: List[str]) -> Tuple[Any, ...]:
    """The recipe's steps as nodes, each one that cannot be written left out with a note."""
    recipe = open_recipe(dataset)
    if recipe is None:
        notes.append(f"transform: {type(dataset).__name__} has no recipe under {' or '.join(RECIPE_ATTRS)}: "
                     "the transform config is empty")
        return ()
    written = [value_node(step) for step in recipe.steps]
    notes += [f"transform step {k} ({callable_name(step)}): left out: {node.why}"
              for k, (step, node) in enumerate(zip(recipe.steps, written)) if not node.ok]
    return tuple(node.node for node in written if node.ok)


def _loader_settings(loader: DataLoader, notes: List[str]) -> Dict[str, Any]:
    """The `loader.*` keys pipebench's schema has, read off the DataLoader."""
    settings: Dict[str, Any] = {"pin_memory": bool(loader.pin_memory), "drop_last": bool(loader.drop_last)}
    if loader.batch_size is not None:
        settings["batch_size"] = int(loader.batch_size)
    else:
        notes.append(f"loader: its batch_sampler ({type(loader.batch_sampler).__name__}) is not exported: "
                     "pipebench's default batch_size is used")
    if loader.num_workers > 0:
        settings["prefetch_factor"] = int(loader.prefetch_factor)
        settings["persistent_workers"] = bool(loader.persistent_workers)
        context = loader.multiprocessing_context
        if context is not None:
            settings["multiprocessing_context"] = context.get_start_method()
    if isinstance(loader.sampler, RandomSampler):
        settings["shuffle"] = True
    elif isinstance(loader.sampler, SequentialSampler):
        settings["shuffle"] = False
    elif loader.batch_size is not None and not isinstance(loader.dataset, IterableDataset):  # a stream has no order
        notes.append(f"loader: its sampler {type(loader.sampler).__name__} is not exported: pipebench draws a "
                     "random order (loader.shuffle=true)")
    collate = loader.collate_fn
    if collate is not default_collate:
        notes.append(f"loader: its collate_fn {callable_name(collate)} is not exported: "
                     "pipebench collates (sample, target) pairs with default_collate")
    if loader.worker_init_fn is not None:
        notes.append("loader: its worker_init_fn is not exported")
    return settings


def export_pipeline(loader: DataLoader, built_with: Optional[BuiltWith]) -> ExportedPipeline:
    """The loader's dataset, recipe and settings as configs; call it before the recipe is timed."""
    notes: List[str] = []
    base = subset_base(loader.dataset)
    if base is not loader.dataset:
        notes.append(f"dataset: the loader reads a Subset of {type(base).__name__} ({len(loader.dataset)} samples): "
                     f"the config reads all of {type(base).__name__}, at the same cost a sample")
    dataset = _dataset_node(base, built_with, notes)
    per_sample = _recipe_nodes(_recipe_source(base, notes), notes)
    settings = _loader_settings(loader, notes)
    if per_sample and loader.num_workers == 0 and torch.get_num_threads() > 1:
        notes.append(f"loader: at workers=0 the script ran its recipe with torch's {torch.get_num_threads()} intra-op "
                     "threads, pipebench run with one (as in workers): a step that uses threads reads slower there")
    return ExportedPipeline(dataset, per_sample, settings, int(loader.num_workers), tuple(notes))


def measured_consumer(step_ms: Sequence[float]) -> Dict[str, Any]:
    """The emulated consumer of the script's measured steps: their median, and their spread as a
    normal distribution's (from the IQR; `fixed` when the steps did not vary)."""
    low, median, high = (float(v) for v in np.percentile(np.asarray(step_ms, dtype=np.float64), [25, 50, 75]))
    spread = (high - low) / IQR_PER_SIGMA
    return {"kind": EMULATED, "step_ms": round(median, 3),
            "distribution": "normal" if spread > 0 else "fixed", "spread_ms": round(spread, 3)}


def with_measured_step(exported: ExportedPipeline, passes: Sequence[Any]) -> ExportedPipeline:
    """The export with the script's own step (each measured step's compute time, from attach's
    `passes`) as its consumer; unchanged where no step was measured."""
    step_ms = [s.compute_ns / NS_PER_MS for p in passes for s in p.steps]
    if not step_ms:
        return exported
    return replace(exported, consumer=measured_consumer(step_ms))
