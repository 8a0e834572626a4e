"""`pipebench attach --export-config`: the measured pipeline written back as configs that `pipebench run`
rebuilds, and what cannot be written named.

The round trip (the script, the JPEG folder and the comparison are benchmarks/export_round_trip.py's):
a script trains on a torchvision ImageFolder of small generated JPEGs through the ImageNet recipe in
v1 and in v2 (one loader each); attach measures it and exports; `pipebench run` on the exported
configs must hold the same steps with the same arguments, and per-step medians close to attach's
(the issue's figure is 15%, printed here and by the benchmark; this box is shared and noisy, so the
test's bound is ROUND_TRIP_BOUND).
"""

import importlib
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets
from torchvision import transforms as T

import pipebench
from pipebench.attach.built_with import recording_datasets
from pipebench.attach.export_config import NOTES_FILE, config_name
from pipebench.cli.main import main
from pipebench.pipeline.instantiate import instantiate_node
from pipebench.record.results import read_result
from conftest import results_folder, run_cli

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
# The medians of a step, attach against run, may differ by this much on the shared 2-core box (the
# issue's target is 15%, printed by this test and the benchmark, and met by quiet runs). The two
# sides run one after the other, and a host that slows one of them slows every step of it alike
# (30% seen here), so the run's medians are first scaled to the same recipe total: what is judged is
# each step's part of the recipe, which an export with a wrong step or argument moves.
ROUND_TRIP_BOUND = 0.4
IMAGES_A_CLASS = 40
STEPS = 30
# In the script's own process, with one intra-op thread as pipebench run uses at workers=0. Workers
# would do the same, but two of them and the main loop on this 2-core box make the medians noisier.
WORKERS = 0
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def round_trip():
    """benchmarks/export_round_trip.py, imported as a script run puts it on the path."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        return importlib.import_module("export_round_trip")


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory, round_trip):
    return round_trip.make_jpeg_folder(tmp_path_factory.mktemp("jpegs"), IMAGES_A_CLASS)


# Not `beside`: it judges each step's measured share of the recipe, which another test's load moves
# (CI, 2026-11-28, beside a shared test: a 0.1 ms flip read 0.23 ms attached, 0.14 ms run, 41% off).
@pytest.mark.slow
def test_the_imagenet_recipes_round_trip_through_pipebench_run(round_trip, jpeg_folder, tmp_path, capsys):
    script, conf, out = tmp_path / "train.py", tmp_path / "conf", tmp_path / "out"
    script.write_text(round_trip.SCRIPT)
    assert main(["attach", "--steps", str(STEPS), "--skip-steps", "2", "--out", str(out), "--export-config", str(conf),
                 "--", "python", str(script), str(jpeg_folder), str(STEPS + 4), str(WORKERS)]) == 0
    printed = capsys.readouterr().out
    names = sorted(p.stem for p in (conf / "transform").glob("*.yaml"))
    assert len(names) == 2 and f"pipebench run --config-dir {conf} dataset={names[0]}" in printed
    for name, version_steps in zip(names, (round_trip.V1_STEPS, round_trip.V2_STEPS)):
        transform = yaml.safe_load((conf / "transform" / f"{name}.yaml").read_text())
        steps = transform["per_sample"]
        assert tuple(s["_target_"].rsplit(".", 1)[1] for s in steps) == version_steps
        assert steps[0]["size"] == [224, 224] and steps[-1]["mean"] == MEAN and steps[-1]["std"] == STD
        dataset = yaml.safe_load((conf / "dataset" / f"{name}.yaml").read_text())
        assert dataset == {"_target_": "pipebench.datasets.image_folder.ImageFolderDataset", "path": str(jpeg_folder),
                           "num_classes": 2, "seed": 0, "cache": "warm"}
        loader = yaml.safe_load((conf / "loader" / f"{name}.yaml").read_text())
        assert loader == {"pin_memory": False, "drop_last": True, "batch_size": 8, "shuffle": True}
    assert "v2.ToDtype" in (conf / "transform" / f"{names[1]}.yaml").read_text()

    run = run_cli(["run", "--config-dir", str(conf), f"dataset={names[0]}", f"transform={names[0]},{names[1]}",
                   f"loader={names[0]}", f"workers={WORKERS}", "run=quick", "run.progress=false", "trace=none",
                   "run.profile_steps=0", "consumer=none", f"results_dir={tmp_path / 'res'}"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    rebuilt = {}
    for job in results_folder(run.stdout).glob("job-*"):
        result = read_result(job / "result.json")
        rebuilt[result["config"]["transform"]["per_sample"][2]["_target_"].rsplit(".", 1)[1]] = result["transforms"]
    worst = 0.0
    for k, (version_steps, third) in enumerate(((round_trip.V1_STEPS, "ToTensor"), (round_trip.V2_STEPS, "ToImage"))):
        here = round_trip.medians(read_result(out / f"job-{k}" / "result.json")["transforms"])
        there = round_trip.medians(rebuilt[third])
        assert tuple(here) == version_steps and tuple(s for s in there if s in here) == version_steps
        drift = sum(there[s] for s in version_steps) / sum(here[s] for s in version_steps)
        print(f"round trip: run / attach over the whole recipe {drift:.2f} (the host's drift between the sides)")
        rows = round_trip.comparison(here, {s: there[s] / drift for s in version_steps}, version_steps)
        for step, attached, ran, ratio in rows:
            print(f"round trip {step}: attach {attached:.4f} ms, run {ran:.4f} ms, ratio {ratio:.2f}")
        worst = max(worst, round_trip.worst_judged(rows))
    print(f"round trip: worst step off by {100 * worst:.0f}% (issue target 15%)")
    assert worst <= ROUND_TRIP_BOUND


class Folder(Dataset):
    """A dataset class from an importable module (this test module), with its recipe as an argument."""

    def __init__(self, size: int, transform=None, scale: float = 1.0) -> None:
        self.size, self.transform, self.scale = size, transform, scale

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i):
        return self.transform(torch.full((3, 8, 8), float(i))), i


def test_a_lambda_step_is_named_as_not_exported_and_the_rest_is(tmp_path):
    recipe = T.Compose([T.CenterCrop(4), T.Lambda(lambda x: x * 2), T.Normalize([0.5] * 3, [0.2] * 3)])
    with recording_datasets() as built:
        dataset = Folder(64, transform=recipe, scale=2.0)
    assert built.arguments(dataset)["scale"] == 2.0
    watched = pipebench.watch(DataLoader(dataset, batch_size=4, num_workers=0), steps=2, skip_steps=0)
    lines = watched.export_config(tmp_path / "conf")
    name = config_name(watched.watch.site)
    printed = "\n".join(lines)
    assert "transform step 1 (Lambda): left out: its argument `lambd`: a lambda at test_attach_export.py:" in printed
    steps = yaml.safe_load((tmp_path / "conf" / "transform" / f"{name}.yaml").read_text())["per_sample"]
    assert [s["_target_"] for s in steps] == ["torchvision.transforms.CenterCrop", "torchvision.transforms.Normalize"]
    dataset_node = yaml.safe_load((tmp_path / "conf" / "dataset" / f"{name}.yaml").read_text())
    # Built before the watch: read back from its attributes, the recipe's argument emptied.
    assert dataset_node == {"_target_": f"{Folder.__module__}.Folder", "size": 64, "transform": None, "scale": 2.0}
    assert "Lambda" in (tmp_path / "conf" / NOTES_FILE).read_text()
    assert f"loader={name} workers=0" in printed


def test_recorded_arguments_and_a_class_of_the_script_itself(tmp_path):
    with recording_datasets() as built:
        dataset = Folder(16, T.CenterCrop(4))
        main_class = type("Local", (Folder,), {"__module__": "__main__"})(16, T.CenterCrop(4))
    assert built.arguments(dataset) == {"size": 16, "transform": dataset.transform}
    assert "__init_subclass__" not in Dataset.__dict__ and not hasattr(Folder.__init__, "__wrapped__")  # put back
    lines = pipebench.watch(DataLoader(main_class, batch_size=4)).export_config(tmp_path / "conf")
    assert any("dataset Local: not exported: Local is defined in the script run as __main__" in line for line in lines)
    assert not (tmp_path / "conf" / "dataset").exists()
    assert any("give one on the command" in line for line in lines)


def test_a_torchvision_image_folder_with_its_own_file_loader_keeps_the_torchvision_class(jpeg_folder):
    dataset = datasets.ImageFolder(str(jpeg_folder), transform=T.ToTensor(), loader=Image.open)
    exported = pipebench.watch(DataLoader(dataset, batch_size=4)).watch.exported
    assert exported.dataset == {"_target_": "torchvision.datasets.folder.ImageFolder", "root": str(jpeg_folder),
                                "transform": None, "target_transform": None,
                                "loader": {"_target_": "hydra.utils.get_object", "path": "PIL.Image.open"}}
    assert exported.per_sample == ({"_target_": "torchvision.transforms.ToTensor"},)


class SelfMade(Folder):
    """Builds its recipe itself: no constructor argument carries it."""

    def __init__(self, size: int) -> None:
        super().__init__(size, T.Compose([T.CenterCrop(4)]))


def test_a_recipe_no_argument_carried_is_emptied_by_the_exported_dataset():
    with recording_datasets() as built:
        dataset = SelfMade(12)
    assert built.arguments(dataset) == {"size": 12}  # the outermost __init__'s, not the parent's
    exported = pipebench.watch(DataLoader(dataset, batch_size=4)).watch.exported
    assert exported.dataset["_target_"] == "pipebench.pipeline.recipe.without_recipe"
    rebuilt = instantiate_node(exported.dataset, "dataset")
    assert type(rebuilt) is SelfMade and rebuilt.transform is None and len(rebuilt) == 12
    assert exported.per_sample == ({"_target_": "torchvision.transforms.CenterCrop", "size": [4, 4]},)


def test_a_random_split_exports_the_dataset_it_splits_and_its_recipe():
    with recording_datasets() as built:
        dataset = Folder(40, transform=T.Compose([T.CenterCrop(4)]), scale=3.0)
    train, _ = torch.utils.data.random_split(dataset, [30, 10], torch.Generator().manual_seed(0))
    exported = pipebench.watch(DataLoader(torch.utils.data.Subset(train, range(20)), batch_size=4),
                               ).watch.exported
    assert built.arguments(dataset)["scale"] == 3.0
    assert exported.dataset == {"_target_": f"{Folder.__module__}.Folder", "size": 40, "transform": None, "scale": 3.0}
    assert exported.per_sample == ({"_target_": "torchvision.transforms.CenterCrop", "size": [4, 4]},)
    assert any("reads a Subset of Folder (20 samples)" in note for note in exported.notes)


def test_a_concat_dataset_exports_its_one_recipe_and_says_why_not_its_datasets():
    recipe = T.Compose([T.CenterCrop(4)])
    with recording_datasets():
        dataset = torch.utils.data.ConcatDataset([Folder(8, transform=recipe), Folder(8, transform=recipe)])
    exported = pipebench.watch(DataLoader(dataset, batch_size=4)).watch.exported
    assert exported.per_sample == ({"_target_": "torchvision.transforms.CenterCrop", "size": [4, 4]},)
    assert exported.dataset is None
    assert any(note.startswith("dataset ConcatDataset: not exported") for note in exported.notes)

    different = torch.utils.data.ConcatDataset([Folder(8, transform=recipe), Folder(8, transform=T.ToTensor())])
    exported = pipebench.watch(DataLoader(different, batch_size=4)).watch.exported
    assert exported.per_sample == ()
    assert any("hold different recipes" in note for note in exported.notes)


def test_an_export_dir_that_is_a_file_is_one_line_before_the_script_runs(tmp_path, capsys):
    (tmp_path / "conf").write_text("")
    (tmp_path / "train.py").write_text("raise SystemExit('ran')")
    assert main(["attach", "--export-config", str(tmp_path / "conf"), "--", "python", str(tmp_path / "train.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"pipebench: error: --export-config {tmp_path / 'conf'}: not a directory"
