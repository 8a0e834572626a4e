"""Config composition, sweep expansion and every bad-input case: one line, exit 2, no traceback."""

from pathlib import Path

import pytest
from conftest import assert_config_error_is_one_line, compose_spec, run_cli

from pipebench.base.errors import ConfigError
from pipebench.base.extras import install_line
from pipebench.cli.main import main
from pipebench.sweep.expand import MAX_LABEL_CHARS, expand_sweep, label
from pipebench.pipeline.build import build_transforms

REPO = Path(__file__).resolve().parents[1]
CHAINS = ["yuv_mask", "yuv_mask_fast", "yuv_mask_crop_first", "yuv_mask_batched"]


def test_defaults_compose_to_the_seed_chain():
    spec = compose_spec([])
    assert spec.dataset_name == "synthetic_jpeg" and spec.transform_name == "yuv_mask"
    assert spec.dataset["length"] == 10000 and spec.dataset["width"] == 533 and spec.dataset["height"] == 800
    assert [n["_target_"].rsplit(".", 1)[1] for n in spec.per_sample] == [
        "PILToTensor", "RandomCrop", "RandomMask", "ConvertColor", "Scale"]
    assert spec.per_batch == ()
    assert spec.workers == 0 and spec.loader.batch_size == 32 and spec.consumer.kind == "emulated"
    assert spec.consumer.step_ms == 30.0 and spec.trace == "torch"


@pytest.mark.parametrize("chain", CHAINS)
def test_every_catalogue_chain_instantiates(chain):
    spec = compose_spec([f"transform={chain}"])
    steps = build_transforms(spec.per_sample, "per_sample") + build_transforms(spec.per_batch, "per_batch")
    assert len(steps) == 5 and all(callable(s) for s in steps)


def test_batched_chain_moves_color_into_the_collate():
    spec = compose_spec(["transform=yuv_mask_batched"])
    assert [n["_target_"].rsplit(".", 1)[1] for n in spec.per_batch] == ["BatchConvertColor", "BatchScale"]


def test_overrides_reach_the_spec():
    spec = compose_spec(["workers=3", "loader=seed", "run.repeats=4", "consumer=emulated"])
    assert (spec.workers, spec.loader.batch_size, spec.run.repeats, spec.consumer.kind) == (3, 256, 4, "emulated")


def test_an_explicit_key_beats_a_group_preset():
    assert compose_spec(["loader=seed", "loader.batch_size=7"]).loader.batch_size == 7


def test_sweep_expansion_matches_hydra_semantics():
    jobs = expand_sweep(["transform=yuv_mask,yuv_mask_fast", "workers=0,2"])
    assert sorted(map(tuple, jobs)) == sorted([
        ("transform=yuv_mask", "workers=0"), ("transform=yuv_mask", "workers=2"),
        ("transform=yuv_mask_fast", "workers=0"), ("transform=yuv_mask_fast", "workers=2")])
    assert [j[0] for j in expand_sweep(["workers=range(0,3)"])] == ["workers=0", "workers=1", "workers=2"]
    assert len(expand_sweep(["workers=choice(1,4)"])) == 2


def test_bad_override_syntax_is_a_config_error():
    with pytest.raises(ConfigError):
        expand_sweep(["workers=[0"])


def test_label_is_folder_safe():
    assert label(["transform=yuv_mask", "workers=0,4,8"]) == "transform-yuv_mask_workers-0+4+8"
    assert "/" not in label(["dataset.path=/a/b"])


def test_a_long_label_is_cut_between_words_and_stays_unique():
    """The README's backends sweep was cut to `..._backend-dataloader+threads+` (the list broken off,
    workers lost), so two sweeps that differ only past the cut shared one name."""
    sweep = ["transform=yuv_mask_fast,imagenet", "loader.backend=dataloader,threads,spdl"]
    two, four = label([*sweep, "workers=2"]), label([*sweep, "workers=4"])
    assert two.startswith("transform-yuv_mask_fast+imagenet_backend-dataloader_")
    assert len(two) <= MAX_LABEL_CHARS and two != four


BAD_INPUTS = [
    (["transform=nope"], "transform/nope"),
    (["transform=yuv_mask,nope"], "transform/nope"),
    (["nosuchkey=1"], "nosuchkey"),
    (["loader.batchsize=3"], "batchsize"),
    (["workers=-1"], "workers"),
    (["workers=0,-2"], "workers"),
    (["loader.batch_size=0"], "loader.batch_size"),
    (["workers=abc"], "workers"),
    (["run.on_error=maybe"], "run.on_error"),
    (["loader.multiprocessing_context=spwan"], "multiprocessing_context"),
    (["loader.sharing_strategy=shm"], "loader.sharing_strategy"),
    (["consumer=gpu"], "consumer/gpu"),
    (["consumer.distribution=poisson"], "consumer.distribution"),
    (["consumer.step_ms=-5"], "consumer.step_ms"),
    (["trace=perfetto"], "trace"),
    (["dataset=image_folder"], "dataset.path"),
    (["dataset=image_folder", "dataset.path=/no/such/dir"], "/no/such/dir"),
    (["transform.per_sample=[{_target_:no_such_module.Thing}]"], "transform.per_sample[0]"),
    # Each catalogue dataset group's keys are typed and checked at compose time, before any build.
    (["dataset=webdataset", "dataset.urls=x.tar", "dataset.shuffle_buffer=-1"], "dataset.shuffle_buffer must be >= 0"),
    (["dataset=webdataset", "dataset.urls=x.tar", "dataset.shuffle_buffer=many"], "dataset.shuffle_buffer"),
    (["dataset=webdataset", "dataset.urls=x.tar", "dataset.shuffle_bufer=8"], "shuffle_bufer"),
    (["dataset.num_images=0"], "dataset.num_images must be >= 1"),
]


@pytest.mark.parametrize("args,named", BAD_INPUTS)
def test_bad_input_is_one_line_exit_2(args, named, capsys, tmp_path):
    assert_config_error_is_one_line(args, named, capsys, tmp_path)


def test_empty_image_folder_is_refused(capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["run", "dataset=image_folder", f"dataset.path={empty}", f"results_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and err.count("\n") == 1


@pytest.mark.slow
def test_real_cli_error_has_no_traceback(tmp_path):
    proc = run_cli(["run", "transform=nope"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "transform/nope" in proc.stderr


# In-process: argparse's exit is the console script's exit status (its `sys.exit(main())` passes
# SystemExit on); the real script's start-up is covered by test_real_cli_error_has_no_traceback.
def test_unknown_verb_exits_2(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["frobnicate"])
    assert exited.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_help_lists_the_run_verb(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0 and "run" in capsys.readouterr().out


def _help_of(verb: str, capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        main([verb, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_run_help_lists_every_shipped_config(capsys):
    """The groups line is read from conf/, so a config added there is listed."""
    text = " ".join(_help_of("run", capsys).split())
    conf = Path(__file__).resolve().parents[1] / "conf"
    for group in ("dataset", "transform", "loader", "consumer", "run", "suite"):
        names = sorted(p.stem for p in (conf / group).glob("*.yaml"))
        assert f"{group}={'|'.join(names)}" in text, group


def test_explore_help_names_every_move(capsys):
    from pipebench.explore.chain import MOVE_HELP, MOVES
    from pipebench.explore.variants import LOADER_MOVE_HELP, LOADER_MOVES

    assert tuple(MOVE_HELP) == MOVES and tuple(LOADER_MOVE_HELP) == LOADER_MOVES
    text = _help_of("explore", capsys)
    missing = [move for move in (*MOVES, *LOADER_MOVES) if f" {move}: " not in text]
    assert not missing, missing


def test_the_decode_floor_examples_run_on_a_jpeg(tmp_path):
    """The README's decode-floor command names these chains: they must build and run."""
    import io
    from pathlib import Path

    import yaml
    from PIL import Image

    folder = Path(__file__).resolve().parents[1] / "examples" / "decode_floor" / "transform"
    chains = sorted(folder.glob("*.yaml"))
    assert [p.stem for p in chains] == ["decode_crop_only", "decoder_torch_mask"]
    data = io.BytesIO()
    Image.new("RGB", (300, 280), (200, 100, 50)).save(data, format="JPEG")
    for path in chains:
        sample = Image.open(io.BytesIO(data.getvalue()))
        for step in build_transforms(yaml.safe_load(path.read_text())["per_sample"], path.stem):
            sample = step(sample)
        assert tuple(sample.shape) == (3, 256, 256), path.stem


@pytest.mark.slow
def test_cfg_prints_every_job_of_the_sweep_and_runs_none(tmp_path, capsys):
    out_dir = tmp_path / "out"
    assert main(["run", "--cfg", "job", "transform=yuv_mask_fast", "workers=0,2", f"results_dir={out_dir}"]) == 0
    text = capsys.readouterr().out
    assert text.count("# job ") == 2 and "# job 2/2: transform=yuv_mask_fast workers=2" in text
    assert "FastRandomMask" in text and "hydra:" not in text and not out_dir.exists()
    assert main(["run", "--cfg", "hydra", "--resolve", "-m", "workers=0", f"results_dir={out_dir}"]) == 0
    hydra_text = capsys.readouterr().out
    # Resolved over the whole config (Hydra's own --cfg hydra --resolve stops at ${results_dir}); a
    # value only a running job has stays as written.
    assert f"dir: {out_dir}/" in hydra_text and "subdir: job-${hydra.job.num}" in hydra_text
    # Hydra's own --info, through the real console script: it sets up logging for a job that never runs.
    info = run_cli(["run", "--multirun", "--info", "searchpath", "workers=0,2", f"results_dir={out_dir}"], tmp_path)
    assert info.returncode == 0 and info.stdout.count("Config search path") == 2, info.stderr
    assert not out_dir.exists()


@pytest.mark.slow
def test_info_lists_the_launcher_once(tmp_path):
    """In a clone, whose folder is on the path, Hydra's plugin scan finds the launcher as well as the
    CLI's registration, and it was listed twice. (Elsewhere an editable install's scan does not find
    it: test_editable_install runs a job there.)"""
    info = run_cli(["run", "--info", "plugins", f"results_dir={tmp_path / 'out'}"], REPO)
    assert info.returncode == 0, info.stderr
    assert info.stdout.count("SubprocessLauncher") == 1, info.stdout


@pytest.mark.parametrize("args, named", [(["--resolve", "workers=0"], "--resolve goes with --cfg"),
                                         (["--cfg", "job", "trnsform=x"], "Key 'trnsform' not in")])
def test_cfg_flags_misused_are_one_line(capsys, args, named):
    assert main(["run", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pipebench: error: ") and "\n" not in err and named in err, err


def test_a_submitit_launcher_without_its_extra_names_the_extra():
    from hydra.errors import MissingConfigException

    from pipebench.config.compose import one_line

    missing = MissingConfigException("Could not find 'hydra/launcher/submitit_local'\nAvailable options in "
                                     "'hydra/launcher':\n\tbasic\n\tpipebench_subprocess", "hydra/launcher/submitit_local")
    assert one_line(missing).endswith(f"the slurm extra: {install_line(['slurm'])}")
    assert "pip install" not in one_line(MissingConfigException("Could not find 'transform/mine'", "transform/mine"))
