"""The storage check's pure parts: presets, the verdict's rules and the search for N."""

import math

import pytest

from pipebench.base.errors import ConfigError
from pipebench.storage_track.presets import WORKLOADS, custom_preset, preset
from pipebench.storage_track.rules import (
    CLOSED,
    INVALID,
    OPEN,
    Procedure,
    memory_rule,
    replicates,
    steps_rule,
    verdict,
)
from pipebench.storage_track.search import judge_rounds, predicted_accelerators, search_accelerators


def test_presets_copy_dlio_step_and_batch():
    assert (preset("resnet50", "h100").step_ms, preset("resnet50", "h100").batch_size) == (pytest.approx(224), 400)
    assert preset("unet3d", "a100").step_ms == pytest.approx(636) and preset("unet3d", "a100").batch_size == 7
    assert preset("cosmoflow", "h100").min_au_pct == 70 and preset("unet3d", "h100").min_au_pct == 90


@pytest.mark.parametrize("workload, accelerator, named", [("bert", "h100", "no workload 'bert'"),
                                                          ("resnet50", "v100", "no preset for accelerator 'v100'")])
def test_an_unknown_preset_is_one_line_listing_what_exists(workload, accelerator, named):
    with pytest.raises(ConfigError) as error:
        preset(workload, accelerator)
    line = str(error.value)
    assert named in line and "\n" not in line
    assert all(name in line for name in WORKLOADS) and "custom" in line and "h100" in line


def test_a_preset_puts_the_users_overrides_last_and_gives_an_image_chain_images():
    plain = preset("resnet50", "h100").overrides(())
    assert "transform=none" in plain and "dataset.images=false" in plain
    assert "dataset.images=true" in preset("resnet50", "h100").overrides(("transform=imagenet",))
    assert custom_preset(30.0, 8).overrides(()) == ("consumer=emulated", "consumer.step_ms=30", "loader.batch_size=8")


def test_replication_within_five_percent():
    assert replicates([100, 102, 98, 101, 99])[0]
    ok, spread = replicates([100, 100, 100, 100, 120])
    assert not ok and spread == pytest.approx(16 / 104)
    assert replicates([100]) == (False, pytest.approx(math.nan, nan_ok=True))


def test_size_rules():
    assert memory_rule(5 * 2**30, 2**30) == ""
    # The host's memory and the 5x it needs both named, so neither reads as the other.
    assert memory_rule(2**30, 3 * 2**30) == "the dataset (1 GiB) is under 5x the host's memory (5 x 3 = 15 GiB)"
    assert "unknown" in memory_rule(None, 2**30)
    assert steps_rule(500 * 8 * 2, 8, 2) == 0 and steps_rule(100, 8, 2) == 8000


def _done(**changes) -> Procedure:
    base = dict(accelerators=3, min_au_pct=90.0, au_pct=(95.0,) * 5, samples_per_s=(100.0, 101, 99, 100, 100))
    return Procedure(**{**base, **changes})


def test_every_rule_met_is_closed():
    assert verdict(_done()).verdict == CLOSED and verdict(_done()).reasons == ()


@pytest.mark.parametrize("changes, reason", [
    (dict(chain="imagenet"), "preprocessing is in"),
    (dict(preset=False), "workload=custom"),
    (dict(shortened=("run.steps=50",), runs_asked=2, au_pct=(95.0,) * 2, samples_per_s=(100.0, 100.0)), "shortened"),
    (dict(memory="the dataset (1 GiB) is under 5x"), "dataset.cache=cold"),
    (dict(samples_per_s=(100.0, 100, 100, 100, 130)), "do not replicate"),
])
def test_departures_are_open_with_their_reason(changes, reason):
    found = verdict(_done(**changes))
    assert found.verdict == OPEN and any(reason in r for r in found.reasons)


@pytest.mark.parametrize("changes, reason", [
    (dict(failure="run 3 was interrupted", au_pct=(95.0,) * 2, samples_per_s=(100.0, 100.0)), "interrupted"),
    (dict(au_pct=(95.0, 95, 80, 95, 95)), "run(s) 3 missed"),
    (dict(accelerators=0), "no number of accelerators"),
    (dict(steps_needed=6000), "it needs 6000 samples"),
])
def test_faults_are_invalid_and_say_why(changes, reason):
    found = verdict(_done(**changes))
    assert found.verdict == INVALID and any(reason in r for r in found.reasons)


def test_the_prediction_is_the_arithmetics():
    # 100 MiB/s, 0.1 s a batch of 10 samples of 1 MiB at 90%: 100 * 0.1 / (0.9 * 10) = 1.11 -> 1
    assert predicted_accelerators(100, 0.1, 10, 2**20, 90) == 1
    assert predicted_accelerators(1000, 0.1, 10, 2**20, 90) == 11


def test_a_round_far_from_the_minimum_decides_alone_and_a_close_one_is_raced():
    assert judge_rounds([99.0], 90) is True and judge_rounds([50.0], 90) is False
    assert judge_rounds([91.0], 90) is None
    assert judge_rounds([91.0, 92.0], 90) is True
    assert judge_rounds([89.0, 88.0], 90) is False
    assert judge_rounds([91.0, 88.0], 90) is None and judge_rounds([91.0, 88.0, 89.0], 90) is False


def _fake(capacity: float, noise=()):
    """AU of N accelerators on a link that feeds `capacity` of them fully: min(100, 100 capacity / N)."""
    calls = []
    extra = list(noise)

    def measure(n, rounds):
        calls.append(n)
        return [min(100.0, 100.0 * capacity / n) + (extra.pop(0) if extra else 0.0) for _ in range(rounds)]
    return measure, calls


@pytest.mark.parametrize("capacity, start", [(7.3, 7), (7.3, 1), (7.3, 20), (30.0, 4), (0.5, 3)])
def test_the_search_finds_the_largest_n_that_meets_from_any_start(capacity, start):
    measure, calls = _fake(capacity)
    outcome = search_accelerators(measure, 90.0, start, 64)
    assert outcome.accelerators == math.floor(capacity / 0.9)
    assert len(set(calls)) <= 2 * math.ceil(math.log2(64)) + 2


def test_the_search_starting_at_the_prediction_measures_few_points():
    measure, calls = _fake(7.3)
    search_accelerators(measure, 90.0, predicted_accelerators(7.3, 1.0, 1, 2**20, 90.0), 64)
    assert sorted(set(calls)) == [8, 9]


def test_a_failed_round_counts_as_a_miss_and_a_capped_search_says_so():
    outcome = search_accelerators(lambda n, rounds: [None] if n > 2 else [100.0], 90.0, 1, 64)
    assert outcome.accelerators == 2 and any(p.failed for p in outcome.probes)
    assert search_accelerators(lambda n, rounds: [100.0], 90.0, 1, 4).capped
