"""storage-check's sweeps, without running a job: the no-chain run's overrides, and a sweep that cannot
start part way through the check, which keeps what finished and ends in its one line and exit 2."""

import json
from pathlib import Path

import pytest
from conftest import compose_spec

from pipebench.base.errors import USAGE_EXIT_STATUS, ConfigError
from pipebench.cli.storage_check import Check, CheckPlan, Sizing, _check, _without_chain
from pipebench.storage_track.options import CheckOptions
from pipebench.storage_track.presets import custom_preset, preset


def _sized(tmp_path: Path, base, cls=Check) -> Check:
    return cls(tmp_path, list(base), None, Sizing(lambda n: 1000 * n, True, "", 10_000.0), 20)


def test_the_no_chain_run_drops_the_users_keys_inside_the_chain(tmp_path):
    # transform.per_sample.0.size reaches into imagenet's list: after transform=none it fails to compose.
    check = _sized(tmp_path, ["transform=imagenet", "transform.per_sample.0.size=128", "+transform.extra=1",
                              "loader.batch_size=8", "transformer_layers=2"])
    assert check.chainless(3) == ["loader.batch_size=8", "transformer_layers=2", "dataset.length=3000",
                                  "distributed.nproc=3", "transform=none", "dataset.images=false", "run.seed=1"]


class _FailsOnSecondN(Check):
    """A search whose first N measures and whose second cannot start (a bad override, a full disk)."""

    def measure(self, n, rounds):
        if self.measured:
            raise ConfigError("Error merging override transform.per_sample.0.size=128: list index out of range")
        self.measured[n] = [95.0, 96.0]
        return [95.0] * rounds


@pytest.mark.parametrize("consumer, step", [("emulated", "Step 50 ms a batch of 4"),
                                             ("toy_cnn", "consumer=toy_cnn's own step a batch of 4")])
def test_a_sweep_that_cannot_start_keeps_the_rounds_and_writes_an_invalid_verdict(tmp_path, capsys, consumer, step):
    check = _sized(tmp_path, ["dataset=storage_samples", "transform=none"], _FailsOnSecondN)
    spec = compose_spec(["dataset=storage_samples", "transform=none", f"consumer={consumer}"])
    plan = CheckPlan(custom_preset(50.0, 4), spec, CheckOptions(workload="custom"), (), "", (), 2, 30.0, ())
    assert _check(check, plan) == USAGE_EXIT_STATUS
    out, err = capsys.readouterr()
    assert err.strip() == "pipebench: error: Error merging override transform.per_sample.0.size=128: list index out of range"
    assert out.strip().splitlines()[-1] == f"results: {tmp_path}"
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["verdict"] == "INVALID" and verdict["consumer"] == consumer
    assert verdict["reasons"][0] == ("the procedure stopped: Error merging override transform.per_sample.0.size=128: "
                                     "list index out of range")
    assert verdict["search"] == [{"accelerators": 2, "au_pct": [95.0, 96.0], "meets": True, "failed": 0}]
    assert f"{step}, minimum AU 90%" in (tmp_path / "report.md").read_text()


class _NoSweep(Check):
    def sweep(self, where, overrides):
        raise AssertionError(f"no job should run: {where}")


def test_a_consumer_that_needs_pixels_gets_no_no_chain_run_and_a_reason(tmp_path):
    """Without a chain the preset hands raw bytes, which the toy CNN cannot take: no job, one reason."""
    spec = compose_spec(["dataset=storage_samples", "transform=imagenet", "consumer=toy_cnn"])
    plan = CheckPlan(preset("resnet50", "h100"), spec, CheckOptions(workload="resnet50"), (), "", (), None, None, ())
    without, note = _without_chain(_sized(tmp_path, [], _NoSweep), plan, 2)
    assert without is None and note == ("the same N without the chain is not measured: consumer=toy_cnn needs "
                                        "pixels, and without a chain the preset hands each sample's raw bytes")
