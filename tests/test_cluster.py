"""Sweeps on a cluster through hydra-submitit-launcher: the shipped SLURM config composes, what
submitit carries pickles, and one job runs through submitit's local executor with no pipebench change."""

import json
import pickle
from pathlib import Path

import pytest
import cloudpickle
from conftest import FAST_JOB, TINY_DATASET, compose_spec, results_folder, run_cli
from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore

from pipebench.sweep.job_task import run_job_task
from pipebench.config.compose import CONFIG_MODULE, CONFIG_NAME, HYDRA_VERSION_BASE
from pipebench.config.schema import register_schema
from pipebench.measure.distributed.ranks import RankTask

SLURM_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "slurm"
TENSOR_CHAIN = ["transform.per_sample=[]", "transform.per_batch=[{_target_: pipebench.transforms.color.BatchScale}]"]


def test_slurm_example_config_composes():
    register_schema(ConfigStore.instance())
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=HYDRA_VERSION_BASE):
        cfg = compose(CONFIG_NAME, overrides=[f"hydra.searchpath=['file://{SLURM_EXAMPLE}']",
                                              "hydra/launcher=pipebench_slurm", "hydra.launcher.partition=debug"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.partition == "debug"  # the command line still wins over the example
    assert (launcher.timeout_min, launcher.cpus_per_task, launcher.gpus_per_node, launcher.tasks_per_node) == (60, 16, 1, 1)


def test_what_submitit_carries_round_trips_through_pickling():
    # submitit cloudpickles the task function with the launcher: it must travel by reference.
    assert cloudpickle.loads(cloudpickle.dumps(run_job_task)) is run_job_task
    assert pickle.loads(pickle.dumps(run_job_task)) is run_job_task
    # A multi-rank job pickles its spec for torchrun's ranks, on whichever node runs it.
    task = RankTask(compose_spec(["distributed.nproc=2", *TINY_DATASET]), "gloo")
    assert pickle.loads(pickle.dumps(task)) == task


@pytest.mark.slow
def test_one_job_through_submitit_local(tmp_path):
    proc = run_cli(["run", "hydra/launcher=submitit_local", "workers=0", *FAST_JOB, *TENSOR_CHAIN,
                    "results_dir=out"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / results_folder(proc.stdout)
    assert (folder / ".submitit").is_dir(), "the job went through submitit"
    (result,) = [json.loads(p.read_text()) for p in folder.glob("job-*/result.json")]
    assert result["summary"]["samples_per_s"] > 0
    assert (result["summary"]["ranks"], result["summary"]["straggler_ratio"]) == (1, 1.0)
    # What lets `pipebench report` merge jobs that ran on different hosts.
    assert result["fingerprint"]["hostname"]
    assert "| job" in (folder / "summary.md").read_text()
