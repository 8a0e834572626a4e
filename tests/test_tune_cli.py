"""`pipebench tune` end to end through the real CLI: the files it writes and its last line, and the
same command resuming it (in this process, through `main`: the resume's lines and files are main's,
and a second console script would pay the interpreter and the verb's imports again, ~4 s). It asserts
on files and lines, not rates, so it runs beside other tests (test_tune.py measures, alone). Tiny
settings: a 2-point space, one stage, one verification round."""

import csv

import pytest
from conftest import FAST_JOB, NO_CHAIN, results_folder, run_cli
from omegaconf import OmegaConf

from pipebench.cli.main import main


TINY_TUNE = ["tune", "--budget-s", "600", *FAST_JOB, *NO_CHAIN, "tune.variants=false", "tune.workers=[0,1]",
             "tune.backends=[dataloader]", "tune.prefetch_factors=[2]", "tune.persistent_workers=[false]",
             "tune.stages=1", "tune.verify_rounds=1", "workers=1", "results_dir=out"]


@pytest.mark.slow
def test_tune_end_to_end_writes_its_files_and_ends_with_the_results_line_and_resumes(tmp_path, monkeypatch, capsys):
    proc = run_cli(TINY_TUNE, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / results_folder(proc.stdout)
    assert folder.name.endswith("-tune-yuv_mask")
    with (folder / "tune.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    raced = [r for r in rows if r["stage"] == "1"]
    assert sorted(r["workers"] for r in raced) == ["0", "1"] and all(r["rounds"] == "2" for r in raced)
    assert [r["verdict"] for r in rows if r["stage"] == "pruned"] == [
        "pruned: pin_memory: no CUDA device here, so pinning does nothing"] * 2
    assert sum(r["verdict"] == "recommended" for r in rows) == 1
    best = OmegaConf.load(folder / "best.yaml")
    assert best.workers in (0, 1) and best.loader.backend == "dataloader"
    markdown = (folder / "tune.md").read_text()
    for section in ("## the space", "## the race", "## recommendation", "paste into your script:"):
        assert section in markdown
    assert (folder / "tune.png").stat().st_size > 0 and (folder / "probe" / "job-0" / "result.json").is_file()
    assert ("verified against your settings" in markdown) or ("your settings are the recommended ones" in markdown)

    # Interrupted (as a Ctrl-C leaves it: no tune.md, a trial unfinished), the same command measures
    # only that trial: every other result is kept as it was.
    (folder / "tune.md").unlink()
    lost = folder / "race-1" / "job-0" / "result.json"
    lost.unlink()
    kept = {path: path.read_bytes() for path in folder.glob("*/job-*/result.json")}
    monkeypatch.chdir(tmp_path)  # results_dir=out, as the first command had it
    status = main(TINY_TUNE)
    out, err = capsys.readouterr()
    assert status == 0, err
    assert tmp_path / results_folder(out) == folder
    assert f"tune: resuming {results_folder(out)}: {len(kept)} finished trial(s) kept" in out
    assert lost.is_file() and (folder / "tune.md").is_file()
    assert all(path.read_bytes() == text for path, text in kept.items())
