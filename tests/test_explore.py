"""`pipebench explore`'s plan, variants and verdicts, on a tiny decode-free dataset; the whole command
through the real CLI is in test_explore_cli.py."""

import sys

import pytest
import torch
from conftest import TINY_DATASET
from explore_kit import STREAM
from stored_results import result_record, write_record

from pipebench.cli.main import main
from pipebench.sweep.expand import expand_sweep, search_path
from pipebench.explore.equivalence import IDENTICAL, NOT_EQUIVALENT, Equivalence
from pipebench.explore.plan import NO_DEVICE, Checked, Plan, conclusions, explore_rows, plan_exploration, what_to_do
from pipebench.base.extras import MissingExtra, install_line, missing_line
from pipebench.explore.chain import GPU_DECODER, GPU_REGION_DECODE, REGION_DECODE, Chain, SampleSource, Variant
from pipebench.explore.variants import explore
from pipebench.pipeline import loader_backends
from pipebench.transforms import region_codec
from pipebench.record.target import reached_target

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone


# In-process from here (a CLI start costs ~8 s): these cases end before any job process starts, and
# the real console script's one-line exit 2 is tested in test_config.py.
def test_nothing_to_move_says_why_and_measures_nothing(chain_project, capsys, monkeypatch):
    monkeypatch.chdir(chain_project)
    assert main(["explore", "--config-dir", "conf", "transform=cropped", *TINY_DATASET, "results_dir=out"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pipebench explore: no variants of transform=cropped: region_decode: ")
    assert "; crop_first: CenterCrop is already first;" in out
    assert not (chain_project / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["transform=yuv_mask,yuv_mask_fast"], "explore takes one chain, got a sweep: transform=yuv_mask,yuv_mask_fast"),
    (["transform.per_sample.1.size=128"], "explore cannot apply transform.per_sample.1.size=128 to variants"),
    (["transform=nope"], "Could not find 'transform/nope'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["explore", *args, "results_dir=out"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipebench: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def _job(folder, num, transform, rnd, rate, cpu):
    write_record(folder, result_record(num, [f"run.round={rnd}", "rounds=3", f"transform={transform}"], rates=[rate],
                                       summary={"transform": transform, "samples_per_s": rate,
                                                "cpu_ms_per_sample": cpu}))


def test_explore_table_takes_medians_over_rounds_and_says_what_to_change(tmp_path):
    base = Variant("c", (), (), Chain(()))
    quick = Variant("c+fast", ("fast",), ("replace Slow with Fast",), Chain(()))
    lean = Variant("c+crop_first", ("crop_first",), ("move Crop ahead of Scale",), Chain(()))
    loose = Variant("c+per_batch", ("per_batch",), ("run Gain once per batch as BatchGain",), Chain(()))
    verdicts = {"c+fast": IDENTICAL, "c+crop_first": IDENTICAL, "c+per_batch": NOT_EQUIVALENT}
    plan = Plan(tmp_path, (), (Checked(base, None),) + tuple(
        Checked(v, Equivalence(verdicts[v.name], "")) for v in (quick, lean, loose)), ())
    # Four rounds, interleaved; round 1 ran on a busy machine (every rate low, CPU barely moved).
    # c+fast's slowest round is below the base's fastest, yet it beat the base 1.5x in every
    # round: paired by round, the drift cancels. c+crop_first's rate is within the noise; its CPU is not.
    measured = {"c": [(100, 6.0), (60, 6.2), (104, 6.1), (98, 6.1)],
                "c+fast": [(150, 4.0), (90, 4.3), (149, 4.1), (151, 4.1)],
                "c+crop_first": [(120, 3.0), (70, 3.1), (100, 3.2), (95, 3.1)], "c+per_batch": [(300, 2.0)] * 4}
    num = 0
    for rnd in range(4):
        for name, values in measured.items():
            _job(tmp_path, num, name, rnd, *values[rnd])
            num += 1
    rows = explore_rows(tmp_path, plan)
    assert [(r.variant, r.rounds, r.samples_per_s, r.cpu_ms_per_sample) for r in rows] == [
        ("c", 4, 99, 6.1), ("c+fast", 4, 149.5, 4.1), ("c+crop_first", 4, 97.5, 3.1), ("c+per_batch", 4, 300, 2.0)]
    assert [(r.rate_vs_base, r.cpu_vs_base) for r in rows] == [
        ("base", "base"), ("up", "down"), ("noisy", "down"), ("up", "down")]
    assert rows[1].speedup == pytest.approx(149.5 / 99) and rows[2].cpu_speedup == pytest.approx(6.1 / 3.1)
    lines = conclusions(rows, plan)
    assert lines[0] == ("fastest equivalent chain: c+fast, 1.51x the samples/s of c (median of 4 interleaved "
                        "rounds; faster than the base in a paired test over the rounds, Holm-corrected over the "
                        "variants); to get it: replace Slow with Fast")
    assert lines[1] == ("least CPU a sample: c+crop_first, 3.1 ms against 6.1 ms for c (1.97x less; below the base "
                        "in a paired test over the rounds, Holm-corrected over the variants); to get it: move Crop "
                        "ahead of Scale")
    assert lines[2] == "c+per_batch ran faster still (3.03x) but is not equivalent"


def test_explore_resolves_nothing_on_fewer_rounds_than_the_rule_needs(tmp_path):
    """Three rounds that each clear the base by 50%: the one rule gives no verdict under MIN_SAMPLES."""
    base = Variant("c", (), (), Chain(()))
    quick = Variant("c+fast", ("fast",), ("replace Slow with Fast",), Chain(()))
    plan = Plan(tmp_path, (), (Checked(base, None), Checked(quick, Equivalence(IDENTICAL, ""))), ())
    num = 0
    for rnd in range(3):
        for name, rate in (("c", 100 + rnd), ("c+fast", 150 + rnd)):
            _job(tmp_path, num, name, rnd, rate, 6.0 if name == "c" else 6.0 + rnd / 100)
            num += 1
    rows = explore_rows(tmp_path, plan)
    assert rows[1].rate_vs_base == "noisy"
    assert "(median of 3 interleaved rounds; fewer than 4 rounds a side, so not resolved)" in conclusions(rows, plan)[0]


def test_explore_suggests_more_rounds_when_four_cannot_tell(tmp_path):
    """A 1.3x median gain whose rounds swing from 0.9x to 1.9x: not resolved, and the line says how to resolve it."""
    base = Variant("c", (), (), Chain(()))
    quick = Variant("c+fast", ("fast",), ("replace Slow with Fast",), Chain(()))
    plan = Plan(tmp_path, (), (Checked(base, None), Checked(quick, Equivalence(IDENTICAL, ""))), ())
    num = 0
    for rnd, gain in enumerate((0.9, 1.9, 1.2, 1.4)):
        for name, rate in (("c", 100.0), ("c+fast", 100.0 * gain)):
            _job(tmp_path, num, name, rnd, rate, 6.0)
            num += 1
    rows = explore_rows(tmp_path, plan)
    assert rows[1].rate_vs_base == "noisy"
    assert "(median of 4 interleaved rounds; within the round-to-round noise, so not resolved; rounds=8 can " \
           "resolve it)" in conclusions(rows, plan)[0]


def test_what_to_do_walks_the_ladder_to_the_equivalent_winner_and_writes_it_as_a_config(tmp_path):
    node = {"_target_": "pipebench.transforms.color.Scale"}
    base = Variant("c", (), (), Chain((node,)))
    one = Variant("c+fast", ("fast",), ("replace Slow with Fast",), Chain((node, node)))
    two = Variant("c+fast+late_cast", ("fast", "late_cast"), ("replace Slow with Fast", "run Scale after the copy"),
                  Chain((node,), (), (node,)))
    alone = Variant("c+late_cast", ("late_cast",), ("run Scale after the copy",), Chain((), (), (node,)))
    wrong = Variant("c+per_batch", ("per_batch",), ("run Gain once per batch",), Chain(()))
    verdicts = {"c+fast": IDENTICAL, "c+fast+late_cast": IDENTICAL, "c+late_cast": IDENTICAL,
                "c+per_batch": NOT_EQUIVALENT}
    plan = Plan(tmp_path, (), (Checked(base, None),) + tuple(
        Checked(v, Equivalence(verdicts[v.name], "")) for v in (one, two, alone, wrong)), ())
    rates = {"c": (100, 8.0), "c+fast": (150, 5.0), "c+fast+late_cast": (240, 3.0), "c+late_cast": (120, 7.0),
             "c+per_batch": (900, 1.0)}
    for num, (name, (rate, cpu)) in enumerate(rates.items()):
        _job(tmp_path, num, name, 0, rate, cpu)
    rows = explore_rows(tmp_path, plan)
    text = what_to_do(tmp_path, rows, plan)
    assert "winner c+fast+late_cast, identical, 2.40x the samples/s and 2.67x less CPU a sample" in text, \
        "the faster not-equivalent chain never wins"
    assert "1. replace Slow with Fast (1.50x on the way; alone 1.50x)" in text
    assert "2. run Scale after the copy (1.60x on the way; alone 1.20x)" in text
    assert f"ready to use: `pipebench run --config-dir {tmp_path / 'winner'} transform=c_winner`" in text, \
        "the line runs as printed: the winner's folder is on Hydra's search path"
    written = (tmp_path / "winner" / "transform" / "c_winner.yaml").read_text()
    assert "on_device:" in written and "pipebench.transforms.color.Scale" in written
    assert len((tmp_path / "waterfall.csv").read_text().strip().splitlines()) == 4, "a header and three rungs"
TV = "torchvision.transforms"
DECODED = Chain(({"_target_": f"{TV}.PILToTensor"}, {"_target_": f"{TV}.RandomCrop", "size": 16},
                 {"_target_": "pipebench.transforms.color.Scale"}))


def test_a_move_whose_library_is_missing_is_named_in_what_to_do(tmp_path, monkeypatch):
    """Without nvImageCodec the region decodes are not tried; the final section says so with the pip
    line, not only the not-applied list mid-output. A chain they could not take names nothing."""
    monkeypatch.setitem(sys.modules, region_codec.MODULE, None)  # import raises ImportError, find_spec None
    found = explore("c", DECODED, source=SampleSource("JPEG", (64, 48)))
    nvimgcodec = [MissingExtra(move, "nvImageCodec", "decode") for move in (REGION_DECODE, GPU_REGION_DECODE)]
    assert found.missing == tuple(nvimgcodec)
    assert not explore("c", Chain(({"_target_": f"{TV}.CenterCrop", "size": 16},)),
                       source=SampleSource("JPEG", (64, 48))).missing, "no decode to replace: nothing missing"
    base = Variant("c", (), (), DECODED)
    plan = Plan(tmp_path, (), (Checked(base, None),), found.not_applied, missing=found.missing)
    _job(tmp_path, 0, "c", 0, 100, 8.0)
    text = what_to_do(tmp_path, explore_rows(tmp_path, plan), plan)
    line = text.strip().splitlines()[-1]
    assert line == f"not tried here, for want of a library: {missing_line(nvimgcodec)} (then explore again)"
    assert install_line(["decode"]) in line and (tmp_path / "waterfall.md").read_text() == text


def test_the_stopping_rule_reads_a_finished_jobs_accel_util_and_ignores_a_job_without_a_sound_result(tmp_path):
    path = write_record(tmp_path, result_record(0, summary={"accel_util_pct": 92.5}))
    assert reached_target(path.parent, 90.0) == 92.5
    assert reached_target(path.parent, 95.0) is None
    assert reached_target(tmp_path / "job-9", 10.0) is None  # failed: no result
    path.write_text("{not json")
    assert reached_target(path.parent, 10.0) is None


def test_gpu_decoder_is_checked_everywhere_and_measured_only_with_cuda(chain_project, monkeypatch):
    """On the synthetic JPEGs its chain is checked (on the CPU without CUDA) and, without CUDA, left
    out of the sweep: the measured job count does not grow on a host without the device."""
    monkeypatch.chdir(chain_project)
    overrides = ["transform=decoded", "dataset=synthetic_jpeg", "dataset.width=64", "dataset.height=48",
                 "dataset.num_images=4", "dataset.length=64", f"dataset.cache_dir={chain_project / 'jpegs'}",
                 "results_dir=out"]
    plan = plan_exploration(overrides, expand_sweep([*search_path("conf"), *overrides])[0])
    gpu = next(item for item in plan.checked if item.variant.moves == (GPU_DECODER,))
    cuda = torch.cuda.is_available()
    assert gpu.variant.chain.on_device[0]["device"] == ("cuda" if cuda else "cpu")
    assert gpu.equivalence.equivalent, gpu.equivalence.detail
    assert gpu.unmeasured == ("" if cuda else NO_DEVICE) and gpu.measured == cuda
    swept = plan.overrides[-1].removeprefix("transform=").split(",")
    assert swept == [item.variant.name for item in plan.checked if item.measured]
    assert (gpu.variant.name in swept) == cuda


def _jpeg_folder(root):
    """Eight small JPEGs in two class folders, for dataset=image_folder."""
    from PIL import Image

    for k in range(8):
        folder = root / f"class{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (48, 40), (30 * k, 255 - 30 * k, 90)).save(folder / f"{k}.jpg", quality=90)
    return root


# Every built-in dataset, with a chain that runs on what it gives (tensors or JPEG files).
DATASETS = {
    "random_tensors": ["transform=scaled", *TINY_DATASET],
    "sharded_stream": ["transform=scaled", *STREAM],
    "synthetic_jpeg": ["transform=decoded", "dataset=synthetic_jpeg", "dataset.width=64", "dataset.height=48",
                       "dataset.num_images=4", "dataset.length=64", "dataset.cache_dir={root}/jpegs"],
    "image_folder": ["transform=decoded", "dataset=image_folder", "dataset.path={root}/folder", "loader.batch_size=4"],
}


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_built_in_dataset_goes_through_explore(chain_project, monkeypatch, name):
    """The plan reads the first samples as the loader would (an iterable dataset has no
    dataset[0]) and checks every variant against the base chain on them."""
    monkeypatch.chdir(chain_project)
    _jpeg_folder(chain_project / "folder")
    overrides = [o.format(root=chain_project) for o in DATASETS[name]] + ["workers=0", "results_dir=out"]
    plan = plan_exploration(overrides, expand_sweep([*search_path("conf"), *overrides])[0])
    assert len(plan.checked) > 1
    moved = [item for item in plan.checked[1:] if item.equivalence.equivalent]
    assert moved, [(item.variant.name, item.equivalence.detail) for item in plan.checked]


def _plan(project, *overrides):
    overrides = ["transform=cropped", *overrides, "results_dir=out"]
    return plan_exploration(overrides, expand_sweep([*search_path("conf"), *overrides])[0])


def test_the_backend_move_is_a_variant_per_other_backend_where_it_applies(chain_project, monkeypatch):
    """CenterCrop alone has no chain move: the loader moves build on the base chain."""
    monkeypatch.chdir(chain_project)
    plan = _plan(chain_project, *TINY_DATASET, "workers=1")
    backends = {item.variant.name: item.variant for item in plan.checked if item.variant.loader[:1] and
                item.variant.loader[0][0] == "backend"}
    assert sorted(backends) == ["cropped+backend_spdl", "cropped+backend_threads"]
    threads = backends["cropped+backend_threads"]
    assert threads.moves == ("backend_threads",) and threads.loader == (("backend", "threads"),)
    assert threads.changes == ('set loader.backend="threads"',)
    assert all(item.verdict == "identical" for item in plan.checked[1:])
    assert not [reason for reason in plan.not_applied if reason.startswith("backend")]


@pytest.mark.parametrize("overrides, reasons", [
    ([*TINY_DATASET, "workers=0"],
     ["backend: the loader has no workers (workers=0), so every backend is the same in-process loop"]),
    ([*STREAM, "workers=1"],
     [f"backend: loader.backend={name} reads samples by index; dataset ShardedStream is an IterableDataset "
      "(use loader.backend=dataloader)" for name in ("threads", "spdl")]),
])
def test_the_backend_move_says_why_it_does_not_apply(chain_project, monkeypatch, overrides, reasons):
    monkeypatch.chdir(chain_project)
    plan = _plan(chain_project, *overrides)
    names = [item.variant.name for item in plan.checked] if isinstance(plan, Plan) else [plan.base]
    assert not [name for name in names if "backend" in name]
    given = plan.not_applied if isinstance(plan, Plan) else plan.reasons
    assert [reason for reason in given if reason.startswith("backend")] == reasons


def test_a_backend_whose_library_is_missing_is_a_reason_not_a_variant(chain_project, monkeypatch):
    monkeypatch.chdir(chain_project)
    monkeypatch.setattr(loader_backends, "installed", lambda module: not module.startswith("spdl"))
    plan = _plan(chain_project, *TINY_DATASET, "workers=1")
    assert [item.variant.name for item in plan.checked if "backend" in item.variant.name] == ["cropped+backend_threads"]
    assert f"backend: loader.backend=spdl needs spdl: {install_line(['spdl'])}" in plan.not_applied
    assert plan.missing == (MissingExtra("loader.backend=spdl", "spdl", "spdl"),)


def test_a_backend_given_on_the_command_line_is_left_as_given(chain_project, monkeypatch):
    """The command line wins over a variant's loader key; under threads the process-only settings
    change nothing, so they are no variants either."""
    monkeypatch.chdir(chain_project)
    plan = _plan(chain_project, *TINY_DATASET, "workers=1", "loader.backend=threads")
    names = [item.variant.name for item in plan.checked]
    assert names[:2] == ["cropped", "cropped+prefetch_factor"] and "backend" not in " ".join(names)
    assert {"persistent_workers: loader.backend=threads runs threads, and the setting is for worker processes",
            "sharing_strategy: loader.backend=threads runs threads, and the setting is for worker processes",
            "backend: loader.backend is set after the chain (on the command line or by the loader config), so explore "
            "leaves it as given"} <= set(plan.not_applied)
