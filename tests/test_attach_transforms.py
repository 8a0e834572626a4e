"""Per-transform time of a watched loader's recipe, the batches the user gets, and replay.

The dataset's `transform` is a v2 Compose of two steps that spin to a wall-clock deadline
(SLOW_MS, FAST_MS), so each row's truth is known whatever else the machine runs.
"""

import io
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from known_cost_kit import known_cost
from spin_kit import Spin
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

import pipebench
from pipebench.attach.watch_chain import open_recipe
from pipebench.cli.main import main
from pipebench.record.results import read_result

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it. The tests
# marked `beside` read the rows' names and pixels and the recipe's reason, no rate: they share the cores.
pytestmark = pytest.mark.alone

SLOW_MS = 2.0
FAST_MS = 0.5
BATCH = 4
STEPS = 16
SKIP = 2
# A spin ends on its deadline; the clock reads and the call around it add a few microseconds,
# and a descheduled spinner may overshoot by a time slice on a loaded 2-core machine.
ROW_TOLERANCE = 0.1


class SlowSpin(Spin):
    pass


class FastSpin(Spin):
    pass


class NoisyDataset(Dataset):
    """Random tensors drawn by the transform's own RNG use (v2.RandomHorizontalFlip), so the batches
    depend on the seed: what attach must not change."""

    def __init__(self, transform) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 400

    def __getitem__(self, i):
        return self.transform(torch.arange(12.0).reshape(1, 3, 4) + i), i


def _recipe():
    return v2.Compose([SlowSpin(SLOW_MS), v2.RandomHorizontalFlip(), FastSpin(FAST_MS)])


def _loader(workers):
    return DataLoader(NoisyDataset(_recipe()), batch_size=BATCH, num_workers=workers, shuffle=True)


def _batches(loader, n):
    torch.manual_seed(7)
    out = []
    for k, (x, y) in enumerate(loader):
        out.append((x.clone(), y.clone()))
        if k + 1 == n:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
@known_cost
def test_rows_of_a_v2_compose_are_its_steps_known_costs_and_the_batches_are_the_users(workers):
    loader = _loader(workers)
    bare = _batches(loader, STEPS + SKIP + 3)
    recipe, collate = loader.dataset.transform, loader.collate_fn
    with pipebench.watch(loader, steps=STEPS, skip_steps=SKIP) as watched:
        seen = _batches(watched, STEPS + SKIP + 3)
    assert loader.dataset.transform is recipe and loader.collate_fn is collate  # restored
    assert len(seen) == len(bare)
    for (x0, y0), (x1, y1) in zip(bare, seen):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    rows = {r["transform"]: r for r in watched.result().transforms}
    assert list(rows) == ["NoisyDataset", "SlowSpin", "RandomHorizontalFlip", "FastSpin", "default_collate"]
    assert rows["NoisyDataset"]["stage"] == "load"
    assert rows["SlowSpin"]["ms_per_call_median"] == pytest.approx(SLOW_MS, rel=ROW_TOLERANCE)
    assert rows["FastSpin"]["ms_per_call_median"] == pytest.approx(FAST_MS, rel=ROW_TOLERANCE)
    assert rows["SlowSpin"]["calls"] == STEPS * BATCH and rows["default_collate"]["calls"] == STEPS
    assert rows["SlowSpin"]["stage"] == "per_sample" and rows["default_collate"]["stage"] == "collate"
    summary = watched.result().record.summary
    assert summary.pipeline_ms_per_sample == pytest.approx(sum(r["ms_per_sample"] for r in rows.values()))
    assert summary.pipeline_ms_per_sample > SLOW_MS + FAST_MS


@known_cost
def test_a_loader_over_a_random_split_times_the_recipe_and_load_of_the_dataset_it_splits():
    train, _ = torch.utils.data.random_split(NoisyDataset(_recipe()), [300, 100], torch.Generator().manual_seed(0))
    loader = DataLoader(torch.utils.data.Subset(train, range(200)), batch_size=BATCH, shuffle=True)
    base = train.dataset
    bare = _batches(loader, STEPS + SKIP + 3)
    with pipebench.watch(loader, steps=STEPS, skip_steps=SKIP) as watched:
        seen = _batches(watched, STEPS + SKIP + 3)
    assert all(torch.equal(x0, x1) and torch.equal(y0, y1) for (x0, y0), (x1, y1) in zip(bare, seen))
    assert "__getitems__" not in vars(base) and isinstance(base.transform, v2.Compose)  # restored
    rows = {r["transform"]: r for r in watched.result().transforms}
    assert list(rows) == ["NoisyDataset", "SlowSpin", "RandomHorizontalFlip", "FastSpin", "default_collate"]
    assert rows["SlowSpin"]["ms_per_call_median"] == pytest.approx(SLOW_MS, rel=ROW_TOLERANCE)
    assert rows["SlowSpin"]["calls"] == STEPS * BATCH and rows["NoisyDataset"]["calls"] == STEPS * BATCH
    assert watched.result().dataset_class == "NoisyDataset"


class LabelSpin(Spin):
    pass


class LabelledDataset(NoisyDataset):
    """NoisyDataset with torchvision's second recipe: `target_transform`, applied to the label."""

    def __init__(self, transform, target_transform) -> None:
        super().__init__(transform)
        self.target_transform = target_transform

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return x, self.target_transform(y)


def _watched_batches(loader):
    """The loader's batches bare, then watched: (bare, watched, the watch)."""
    bare = _batches(loader, STEPS + SKIP + 3)
    with pipebench.watch(loader, steps=STEPS, skip_steps=SKIP) as watched:
        seen = _batches(watched, STEPS + SKIP + 3)
    return bare, seen, watched


def _same(bare, seen):
    return len(bare) == len(seen) and all(torch.equal(x0, x1) and torch.equal(y0, y1)
                                          for (x0, y0), (x1, y1) in zip(bare, seen))


@pytest.mark.parametrize("workers", [0, 2])
@known_cost
def test_a_target_transform_is_a_row_of_its_own_out_of_the_load(workers):
    dataset = LabelledDataset(_recipe(), LabelSpin(FAST_MS))
    target = dataset.target_transform
    bare, seen, watched = _watched_batches(DataLoader(dataset, batch_size=BATCH, num_workers=workers, shuffle=True))
    assert _same(bare, seen) and dataset.target_transform is target  # restored
    rows = {r["transform"]: r for r in watched.result().transforms}
    assert list(rows) == ["LabelledDataset", "SlowSpin", "RandomHorizontalFlip", "FastSpin",
                          "LabelSpin (target_transform)", "default_collate"]
    assert rows["LabelSpin (target_transform)"]["ms_per_call_median"] == pytest.approx(FAST_MS, rel=ROW_TOLERANCE)
    assert rows["LabelSpin (target_transform)"]["calls"] == STEPS * BATCH
    # The label's spin is not the load's: charged to it, the load would read at least FAST_MS more than
    # its own cost. Half of FAST_MS was too tight a bound: CI read the load alone at 0.27 ms on a loaded host.
    assert rows["LabelledDataset"]["ms_per_call_median"] < FAST_MS


@known_cost
def test_a_concat_dataset_of_one_recipe_times_its_steps_across_its_datasets():
    recipe = _recipe()
    parts = [NoisyDataset(recipe), torch.utils.data.Subset(NoisyDataset(recipe), range(100))]
    bare, seen, watched = _watched_batches(DataLoader(torch.utils.data.ConcatDataset(parts), batch_size=BATCH,
                                                      shuffle=True))
    assert _same(bare, seen) and parts[0].transform is recipe and parts[1].dataset.transform is recipe
    rows = {r["transform"]: r for r in watched.result().transforms}
    assert list(rows) == ["ConcatDataset", "SlowSpin", "RandomHorizontalFlip", "FastSpin", "default_collate"]
    assert rows["SlowSpin"]["calls"] == STEPS * BATCH
    assert rows["SlowSpin"]["ms_per_call_median"] == pytest.approx(SLOW_MS, rel=ROW_TOLERANCE)


@known_cost
def test_a_concat_dataset_of_different_recipes_is_timed_whole_in_its_named_load_row():
    parts = [NoisyDataset(_recipe()), NoisyDataset(v2.Compose([FastSpin(FAST_MS)]))]
    bare, seen, watched = _watched_batches(DataLoader(torch.utils.data.ConcatDataset(parts), batch_size=BATCH,
                                                      shuffle=True))
    assert _same(bare, seen) and all(isinstance(p.transform, v2.Compose) and "__getitems__" not in vars(p)
                                     for p in parts)
    (load, collate) = watched.result().transforms
    assert load["stage"] == "load" and load["transform"].startswith("ConcatDataset (")
    assert "recipes differ" in load["transform"] and load["calls"] == STEPS * BATCH
    assert FAST_MS < load["ms_per_call_mean"] < SLOW_MS + FAST_MS * (1 + ROW_TOLERANCE)
    assert collate["stage"] == "collate"


class LazyJpegs(Dataset):
    """JPEGs opened lazily (PIL.Image.open reads the header only), as ImageFolder does."""

    def __init__(self, transform) -> None:
        buffer = io.BytesIO()
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (256, 256, 3), np.uint8)).save(buffer, "JPEG")
        self.data = buffer.getvalue()
        self.transform = transform

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        image = Image.open(io.BytesIO(self.data))
        for step in self.transform:  # a list of callables, applied by the dataset itself
            image = step(image)
        return image, i


@pytest.mark.beside
def test_a_lazy_image_is_decoded_on_its_own_row_with_the_same_pixels():
    recipe = [v2.CenterCrop(64), v2.PILToTensor()]
    bare = next(iter(DataLoader(LazyJpegs(recipe), batch_size=4)))[0]
    loader = DataLoader(LazyJpegs(recipe), batch_size=4)
    with pipebench.watch(loader, steps=6, skip_steps=1) as watched:
        batches = [x for x, _ in watched]
    assert torch.equal(batches[0], bare)
    rows = {r["transform"]: r for r in watched.result().transforms}
    assert list(rows) == ["LazyJpegs", "decode", "CenterCrop", "PILToTensor", "default_collate"]
    assert rows["decode"]["stage"] == "decode" and rows["decode"]["ms_per_call_median"] > 0


@pytest.mark.beside
def test_a_recipe_that_cannot_be_opened_is_one_row_named_with_the_reason():
    class Opaque:
        def __call__(self, x):
            return x

    recipe = open_recipe(NoisyDataset(Opaque()))
    assert recipe.not_opened == "not a Compose or a list of callables"
    assert recipe.names[1].name == "Opaque (not opened: not a Compose or a list of callables)"
    assert open_recipe(torch.utils.data.TensorDataset(torch.zeros(3))) is None


REPLAY_SCRIPT = textwrap.dedent("""
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from torchvision.transforms import v2

    FETCH_MS, STEP_MS, LAST = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])

    class Spin:
        def __call__(self, x):
            end = time.perf_counter() + FETCH_MS / 1000
            while time.perf_counter() < end:
                pass
            return x

    class Busy(Dataset):
        transform = v2.Compose([Spin()])
        def __len__(self):
            return 4000
        def __getitem__(self, i):
            return self.transform(torch.zeros(3)), i

    for n, (x, y) in enumerate(DataLoader(Busy(), batch_size=4)):
        time.sleep(STEP_MS / 1000)
        if n == LAST:
            break
""")
REPLAY_FETCH_MS = 2.0  # a sample: 8 ms of wait a batch of 4
REPLAY_STEP_MS = 8.0
# The step's sleep overshoots by a fraction of a millisecond; headroom is a ratio of two such.
HEADROOM_TOLERANCE = 0.1
# The window's steps after the first batch and 3 skipped, then the replay's batches, each kept as it
# passes and fed again: the script ends a few batches after them (a batch is 16 ms).
REPLAY_WINDOW_STEPS, REPLAY_STEPS = 20, 10
REPLAY_LAST_BATCH = 1 + 3 + REPLAY_WINDOW_STEPS + 2 * REPLAY_STEPS + 6


@pytest.mark.slow
@known_cost
def test_attach_replay_gives_the_headroom_of_a_perfect_loader(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(REPLAY_SCRIPT)
    out = tmp_path / "out"
    assert main(["attach", "--steps", str(REPLAY_WINDOW_STEPS), "--skip-steps", "3", "--replay", str(REPLAY_STEPS),
                 "--out", str(out), "--", "python", str(script), str(REPLAY_FETCH_MS), str(REPLAY_STEP_MS),
                 str(REPLAY_LAST_BATCH)]) == 0
    result = read_result(out / "job-0" / "result.json")
    summary = result["summary"]
    truth = (4 * REPLAY_FETCH_MS + REPLAY_STEP_MS) / REPLAY_STEP_MS
    assert summary["replay_steps"] == REPLAY_STEPS
    assert summary["headroom_x"] == pytest.approx(truth, rel=HEADROOM_TOLERANCE)
    assert summary["replay_step_ms"] == pytest.approx(REPLAY_STEP_MS, rel=HEADROOM_TOLERANCE)
    assert [t["transform"] for t in result["transforms"]] == ["Busy", "Spin", "default_collate"]
    assert main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    # The load row completes the chain's cost a sample: the model takes the watched loader in.
    assert "left out of the model" not in report and "Dominant cost in loader=train.py:" in report
