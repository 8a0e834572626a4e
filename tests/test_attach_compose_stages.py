"""A torchvision Compose given to a WebDataset stage (`map_tuple(Compose([...]), ...)`, `map(Compose)`) is
opened into its steps, a row each, as a dataset's `transform` recipe is (issue 55, attach on real scripts).
No timing is asserted: the rows' names, that each step's column is filled, and that the user's Compose is
untouched."""

import io

import numpy as np
import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from pipebench.attach.watch_chain import FIRST_STEP_COLUMN, TimedStep
from pipebench.attach.watch_stages import timed_any

SAMPLES = 4


def _shard(root):
    with wds.TarWriter(str(root / "shard-000000.tar")) as sink:
        for i in range(SAMPLES):
            jpeg = io.BytesIO()
            Image.new("RGB", (32, 32), (i, 80, 160)).save(jpeg, format="JPEG")
            sink.write({"__key__": f"{i:06d}", "jpg": jpeg.getvalue(), "cls": str(i).encode()})
    return str(root / "shard-000000.tar")


def label(value):
    return int(value)


def test_a_compose_in_map_tuple_is_opened_into_its_steps(tmp_path):
    recipe = v2.Compose([v2.PILToTensor(), v2.CenterCrop(16), v2.ToDtype(torch.float32, scale=True)])
    steps = list(recipe.transforms)
    dataset = wds.WebDataset(_shard(tmp_path), shardshuffle=False).decode("pil").to_tuple("jpg", "cls")
    dataset = dataset.map_tuple(recipe, label)
    with timed_any(DataLoader(dataset, batch_size=2)) as timing:
        names = [name.name for name in timing.names][2:]
        assert names == ["PILToTensor (map_tuple 0)", "CenterCrop (map_tuple 0)", "ToDtype (map_tuple 0)",
                         "label (map_tuple 1)"]
        image, target = next(iter(dataset))
        assert image.shape == (3, 16, 16) and image.dtype == torch.float32 and target == 0
    # The user's Compose holds its own steps again (it was never touched: a copy was timed).
    assert recipe.transforms == steps and not any(isinstance(step, TimedStep) for step in recipe.transforms)


def test_each_step_of_an_opened_compose_fills_its_own_column(tmp_path):
    recipe = v2.Compose([v2.PILToTensor(), v2.CenterCrop(8)])
    dataset = wds.WebDataset(_shard(tmp_path), shardshuffle=False).decode("pil").to_tuple("jpg", "cls")
    dataset = dataset.map_tuple(recipe)
    with timed_any(DataLoader(dataset, batch_size=2)):
        samples = list(dataset)
        clock = next(stage.clock for stage in dataset.pipeline if type(stage).__name__ == "SampleBoundary")
        wall, _ = clock.drain()
    assert len(samples) == SAMPLES and wall.shape == (SAMPLES, FIRST_STEP_COLUMN + 2)
    assert np.all(wall[:, FIRST_STEP_COLUMN:] > 0), wall  # each step's call timed into its own column


def test_a_function_that_is_no_compose_stays_one_row(tmp_path):
    dataset = wds.WebDataset(_shard(tmp_path), shardshuffle=False).decode("pil").map(lambda sample: sample)
    with timed_any(DataLoader(dataset, batch_size=2)) as timing:
        assert [name.name for name in timing.names][2:] == ["<lambda> (map)"]
