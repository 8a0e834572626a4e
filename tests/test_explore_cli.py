"""`pipebench explore` end to end: the variants it measures, the rows and files it writes. Each asserts
on files, rows and lines, not on a rate, so it runs beside other tests (test_explore.py measures,
alone). The interleaved case runs the real console script; the others call `main()` in this process,
as they read what a run wrote and said, not how the command's own process behaves: explore's
command imports torch and torchvision (about 4 s on the 2-core VM), once a pytest process that way
instead of once a run. Its job processes start either way."""

import csv
import json

import pytest
from conftest import FAST_JOB, NO_PROFILE, QUICK_RUN, TINY_DATASET, main_in, results_folder, run_cli
from explore_kit import STREAM

from pipebench.base.significance import NOISY
from pipebench.config.limits import MAX_PREFETCH_FACTOR

# The loader moves other than the backend held where they are, so the backend's variants are the
# only loader variants (no CUDA here: pin_memory does not apply either).
OTHER_LOADER_MOVES_HELD = ["loader.persistent_workers=true", "loader.sharing_strategy=file_system",
                           f"loader.prefetch_factor={MAX_PREFETCH_FACTOR}"]


def _csv(path):
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_explore_measures_every_variant_interleaved(chain_project):
    proc = run_cli(["explore", "--config-dir", "conf", "transform=scaled", *FAST_JOB, "rounds=2", "results_dir=out"],
                   cwd=chain_project)
    assert proc.returncode == 0, proc.stderr
    folder = chain_project / results_folder(proc.stdout)
    assert folder.name.endswith("-explore-scaled")
    variants = json.loads((folder / "variants.json").read_text())
    assert variants["base"] == "scaled"
    assert [v["name"] for v in variants["variants"]] == ["scaled", "scaled+crop_first"]
    moved = variants["variants"][1]
    assert moved["moves"] == ["crop_first"] and moved["changes"] == ["move RandomCrop ahead of Scale"]
    assert [n["_target_"].rsplit(".", 1)[-1] for n in moved["chain"]["per_sample"]] == ["RandomCrop", "Scale", "BusyWait"]
    assert moved["equivalence"]["verdict"] == "identical" and moved["equivalence"]["equivalent"] is True
    not_applied = variants["not_applied"]
    assert not_applied[:4] == ["region_decode: the dataset gives tensor samples, not JPEG files: decode moves skipped",
                               "tensor_path: the dataset gives tensor samples, not JPEG files: decode moves skipped",
                               "decoder: the chain starts from tensors (Scale accepts only tensors): there is no "
                               "image file to decode",
                               "reduced_decode: the dataset gives tensor samples, not JPEG files: decode moves skipped"]
    assert "fast: no transform in the chain declares a fast_form" in not_applied
    assert "per_batch: the last per-sample transform, BusyWait, declares no batch_form" in not_applied
    assert (folder / "variants" / "transform" / "scaled+crop_first.yaml").exists()
    assert [r["verdict"] for r in _csv(folder / "equivalence.csv")] == ["base", "identical"]
    # Printed before anything was measured.
    assert proc.stdout.index("## equivalence with scaled") < proc.stdout.index("[job 1/4]")

    # One result per variant and round, interleaved: every variant once before any runs again.
    summary = _csv(folder / "summary.csv")
    assert [r["transform"] for r in summary] == ["scaled", "scaled+crop_first"] * 2
    assert all(float(r["samples_per_s"]) > 0 for r in summary)
    results = sorted(folder.glob("job-*/result.json"))
    chains = [json.loads(p.read_text())["config"]["transform"]["per_sample"][0]["_target_"] for p in results]
    assert chains == ["pipebench.transforms.color.Scale", "torchvision.transforms.RandomCrop"] * 2

    table = _csv(folder / "explore.csv")
    assert [(r["variant"], r["rounds"], r["verdict"]) for r in table] == [
        ("scaled", "2", "base"), ("scaled+crop_first", "2", "identical")]
    assert float(table[0]["speedup"]) == 1.0
    assert "## explore" in proc.stdout and (folder / "explore.md").read_text().strip() in proc.stdout


@pytest.mark.slow
def test_explore_with_a_target_stops_at_the_first_chain_that_meets_it(chain_project, capfd, monkeypatch):
    """A trivial chain into a 40 ms emulated step keeps the consumer well over 50% busy at workers=0
    (about 1 ms of loading a step against the 40 ms sleep, from the first step: no warm-up needed),
    so the base chain's first job meets the target and the three jobs after it never run."""
    status, out, err = main_in(chain_project, [
        "explore", "--config-dir", "conf", "--target", "50", "transform=scaled", *TINY_DATASET, *QUICK_RUN, *NO_PROFILE,
        "run.warmup_steps=0", "run.min_time_s=0", "rounds=2", "consumer.step_ms=40", "results_dir=out"],
        capfd, monkeypatch)
    assert status == 0, err
    assert "reached run.target_accel_util_pct=50: stopping the sweep (3 jobs not run; run.stop_at_target)" in out
    assert "[job 1/4]" in out and "[job 2/4]" not in out
    folder = chain_project / results_folder(out)
    results = [json.loads(p.read_text()) for p in folder.glob("job-*/result.json")]
    assert [r["summary"]["transform"] for r in results] == ["scaled"]
    assert results[0]["config"]["run"]["target_accel_util_pct"] == 50.0
    assert "### cores for accel_util_pct ≥ 50%" in (folder / "report.md").read_text()


@pytest.mark.slow
def test_explore_measures_an_iterable_dataset_and_refuses_a_chain_that_fails_on_it(chain_project, capfd,
                                                                                     monkeypatch):
    status, out, err = main_in(chain_project, [
        "explore", "--config-dir", "conf", "transform=scaled", *STREAM, *QUICK_RUN, "consumer=none", *NO_PROFILE,
        "run.warmup_steps=0", "run.min_time_s=0", "rounds=1", "results_dir=out"], capfd, monkeypatch)
    assert status == 0, err
    rows = _csv(chain_project / results_folder(out) / "summary.csv")
    assert sorted(row["transform"] for row in rows) == ["scaled", "scaled+crop_first"]
    status, _, err = main_in(chain_project, ["explore", "--config-dir", "conf", "transform=decoded", *STREAM,
                                             "workers=0", "results_dir=out2"], capfd, monkeypatch)
    err = err.strip()
    assert status == 2
    assert "\n" not in err and "transform=decoded fails on the dataset's first samples (TypeError" in err, err
    assert not (chain_project / "out2").exists()


@pytest.mark.slow
def test_explore_measures_the_backend_variants(chain_project, capfd, monkeypatch):
    status, out, err = main_in(chain_project, ["explore", "--config-dir", "conf", "transform=cropped", *FAST_JOB,
                                               "workers=1", *OTHER_LOADER_MOVES_HELD, "rounds=1", "results_dir=out"],
                               capfd, monkeypatch)
    assert status == 0, err
    folder = chain_project / results_folder(out)
    expected = ["cropped", "cropped+backend_threads", "cropped+backend_spdl"]
    summary = _csv(folder / "summary.csv")
    assert [row["transform"] for row in summary] == expected
    assert all(float(row["samples_per_s"]) > 0 for row in summary)
    results = sorted(folder.glob("job-*/result.json"))
    assert [json.loads(p.read_text())["config"]["loader"]["backend"] for p in results] == [
        "dataloader", "threads", "spdl"]
    table = _csv(folder / "explore.csv")
    assert [(row["variant"], row["verdict"]) for row in table] == [
        ("cropped", "base"), ("cropped+backend_threads", "identical"), ("cropped+backend_spdl", "identical")]
    # One round a side: the one rule for "is it real?" (base/significance.py) cannot call it real,
    # as for any move.
    assert [row["rate_vs_base"] for row in table] == ["base", NOISY, NOISY]
