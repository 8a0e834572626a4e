"""Consumers: the emulated accelerator's timing and draws, the toy CNN's shape and training, CUDA hygiene."""

import json
import pickle
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from cuda_marks import NEEDS_CUDA
from pipebench.base.errors import ConfigError
from pipebench.config.specs import ConsumerSpec
from pipebench.pipeline.consumers import (
    Consumer,
    EmulatedConsumer,
    NoConsumer,
    StepTimeDistribution,
    ToyCNN,
    ToyCnnConsumer,
    build_consumer,
)

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

# Enough draws that the sample mean/std sit well inside the tolerances below (SE ~ 0.04 ms).
DRAWS = 20_000


def spec(kind="emulated", step_ms=30.0, distribution="fixed", spread_ms=0.0, lr=0.001, momentum=0.9,
         device="auto") -> ConsumerSpec:
    return ConsumerSpec(kind, step_ms, distribution, spread_ms, lr, momentum, device)


def tiny_batch(n=8, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    return data, labels


# --- interface --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["none", "emulated", "toy_cnn"])
def test_every_kind_follows_the_interface_and_pickles(kind):
    consumer = build_consumer(spec(kind, step_ms=0.0, device="cpu"), seed=0)
    assert isinstance(consumer, Consumer)
    assert type(consumer) is {"none": NoConsumer, "emulated": EmulatedConsumer, "toy_cnn": ToyCnnConsumer}[kind]
    assert pickle.loads(pickle.dumps(consumer)).report()["kind"] == kind
    json.dumps(consumer.report())


def test_devices_follow_the_kind():
    accel = torch.device("cuda") if torch.cuda.is_available() else None
    assert build_consumer(spec("none"), 0).device is None
    assert build_consumer(spec("emulated"), 0).device == accel
    assert build_consumer(spec("toy_cnn", device="cpu"), 0).device == torch.device("cpu")
    auto = build_consumer(spec("toy_cnn", device="auto"), 0).device
    assert auto == (accel or torch.device("cpu"))


CONSTRUCT_ALL_KINDS = (
    "import torch\n"
    "from pipebench.pipeline.consumers import build_consumer\n"
    "from pipebench.config.specs import ConsumerSpec\n"
    "for kind in ('none', 'emulated', 'toy_cnn'):\n"
    "    build_consumer(ConsumerSpec(kind, 1.0, 'fixed', 0.0, 0.001, 0.9, 'auto'), 0)\n"
    "print(torch.cuda.is_initialized())\n"
)


def test_construction_does_not_initialise_cuda():
    """DataLoader workers may be forked after construction, so it must leave CUDA alone."""
    if torch.cuda.is_initialized():
        # An earlier test brought CUDA up in this process: check in a fresh one instead.
        out = subprocess.run([sys.executable, "-c", CONSTRUCT_ALL_KINDS], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "False"
        return
    for kind in ("none", "emulated", "toy_cnn"):
        build_consumer(spec(kind, device="auto"), 0)
    assert not torch.cuda.is_initialized()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_asking_for_cuda_without_it_is_a_config_error():
    with pytest.raises(ConfigError, match="consumer.device=cuda"):
        build_consumer(spec("toy_cnn", device="cuda"), 0)


def test_cpu_toy_cnn_never_touches_cuda():
    if torch.cuda.is_initialized():
        pytest.skip("CUDA was initialised earlier in this process")
    consumer = build_consumer(spec("toy_cnn", device="cpu"), 0)
    consumer.step(*tiny_batch(2, 8))
    assert not torch.cuda.is_initialized()


# --- emulated ---------------------------------------------------------------------------------

def test_emulated_fixed_step_sleeps_step_ms_without_cpu():
    step_ms, steps = 30.0, 10
    consumer = build_consumer(spec("emulated", step_ms=step_ms), seed=0)
    per_step = []
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        t0 = time.perf_counter()
        consumer.step(None, None)
        per_step.append((time.perf_counter() - t0) * 1000)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    assert step_ms - 0.5 < float(np.median(per_step)) < step_ms + 2.0, per_step
    assert 0.95 * steps * step_ms / 1000 < wall < 1.3 * steps * step_ms / 1000
    assert cpu < 0.2 * wall, f"{cpu:.4f} s CPU in {wall:.4f} s wall: the sleep must not spin"
    report = consumer.report()
    assert report["drawn_ms"]["mean"] == step_ms and report["drawn_ms"]["std"] == 0.0
    assert report["slept_ms"]["n"] == steps and abs(report["slept_ms"]["median"] - step_ms) < 2.0


def test_normal_draws_have_the_asked_mean_and_std():
    drawn = StepTimeDistribution("normal", 30.0, 5.0).draw_ms(np.random.default_rng(1), DRAWS)
    assert abs(drawn.mean() - 30.0) < 0.2 and abs(drawn.std() - 5.0) < 0.2


def test_uniform_draws_span_step_plus_minus_spread():
    drawn = StepTimeDistribution("uniform", 30.0, 6.0).draw_ms(np.random.default_rng(1), DRAWS)
    assert abs(drawn.mean() - 30.0) < 0.2 and abs(drawn.std() - 12.0 / np.sqrt(12)) < 0.1
    assert 24.0 <= drawn.min() < 24.1 and 35.9 < drawn.max() <= 36.0


@pytest.mark.parametrize("kind", ["normal", "uniform"])
def test_draws_are_clipped_at_zero(kind):
    drawn = StepTimeDistribution(kind, 1.0, 5.0).draw_ms(np.random.default_rng(1), DRAWS)
    assert drawn.min() == 0.0 and (drawn == 0.0).mean() > 0.2


def test_emulated_draws_are_reproducible_per_seed_and_leave_global_rngs_alone():
    np_state, torch_state = np.random.get_state(), torch.get_rng_state()
    dist = spec("emulated", step_ms=5.0, distribution="normal", spread_ms=2.0)
    a, b, c = (build_consumer(dist, seed) for seed in (7, 7, 8))
    seq = [[x.next_step_ms() for _ in range(50)] for x in (a, b, c)]
    assert seq[0] == seq[1] and seq[0] != seq[2]
    assert len(set(seq[0])) == 50
    after = np.random.get_state()
    assert after[0] == np_state[0] and np.array_equal(after[1], np_state[1]) and after[2:] == np_state[2:]
    assert torch.equal(torch.get_rng_state(), torch_state)


def test_emulated_report_follows_the_sleeps():
    consumer = build_consumer(spec("emulated", step_ms=1.0, distribution="uniform", spread_ms=0.5), 3)
    for _ in range(20):
        consumer.step(None, None)
    report = consumer.report()
    json.dumps(report)
    assert report["drawn_ms"]["n"] == 20 and 0.5 <= report["drawn_ms"]["min"] <= report["drawn_ms"]["max"] <= 1.5
    assert report["slept_ms"]["mean"] >= 0.5 * report["drawn_ms"]["mean"]


# --- toy CNN ----------------------------------------------------------------------------------

def test_toy_cnn_256_has_eight_blocks_and_the_hand_counted_parameters():
    model = ToyCNN(256)
    conv_in = 3 * 30 * 3 * 3 + 30
    block = 30 * 30 * 3 * 3 + 30
    conv_out = 30 * 10 * 3 * 3 + 10
    assert len(model.blocks) == 8
    assert sum(p.numel() for p in model.parameters()) == conv_in + 8 * block + conv_out == 68_590
    with torch.no_grad():
        assert model(torch.rand(2, 3, 256, 256)).shape == (2, 10)


def test_toy_cnn_blocks_follow_a_small_input():
    model = ToyCNN(32)
    assert len(model.blocks) == 5
    with torch.no_grad():
        assert model(torch.rand(4, 3, 32, 32)).shape == (4, 10)


@pytest.mark.parametrize("shape", [(3, 48, 48), (3, 32, 64), (1, 32, 32)])
def test_toy_cnn_rejects_unusable_images_with_a_clear_error(shape):
    consumer = build_consumer(spec("toy_cnn", device="cpu"), 0)
    with pytest.raises(ValueError, match="toy_cnn"):
        consumer.step(torch.zeros(2, *shape, dtype=torch.uint8), torch.zeros(2, dtype=torch.long))


def test_toy_cnn_model_rejects_bad_sizes():
    with pytest.raises(ValueError, match="power of two"):
        ToyCNN(48)
    with pytest.raises(ValueError, match="expects"):
        ToyCNN(32)(torch.zeros(1, 3, 64, 64))


def test_toy_cnn_overfits_a_tiny_batch_on_cpu():
    """30 steps on 8 fixed 16x16 images: a working loop cuts the loss by ~25%, a broken one by ~0."""
    consumer = build_consumer(spec("toy_cnn", lr=0.05, device="cpu"), seed=0)
    data, labels = tiny_batch(8, 16)
    for _ in range(30):
        consumer.step(data, labels)
    report = consumer.report()
    json.dumps(report)
    assert report["loss_last"] < 0.85 * report["loss_first"], report
    assert (report["device"], report["timer"], report["input_size"], report["blocks"]) == ("cpu", "perf_counter", 16, 4)
    for phase in ("forward", "backward", "optimizer"):
        assert report["phases_ms"][phase]["n"] == 29 and report["phases_ms"][phase]["mean"] > 0
    # The phases are readings inside the host-timed region of the same steps.
    assert report["timed_ms"]["n"] == 29
    assert sum(p["mean"] for p in report["phases_ms"].values()) <= report["timed_ms"]["mean"]


def test_toy_cnn_weights_follow_the_seed_and_take_float_input():
    data, labels = tiny_batch(4, 16)
    reports = []
    for seed, batch in ((1, data), (1, data.float() / 255), (2, data)):
        consumer = build_consumer(spec("toy_cnn", device="cpu"), seed)
        consumer.step(batch, labels)
        reports.append(consumer.report()["loss_first"])
    assert reports[0] == pytest.approx(reports[1], rel=1e-5) and reports[0] != reports[2]


# --- GPU only ---------------------------------------------------------------------------------

@NEEDS_CUDA
def test_toy_cnn_on_cuda_is_timed_with_cuda_events():
    consumer = build_consumer(spec("toy_cnn", device="auto"), 0)
    assert consumer.device.type == "cuda"
    data, labels = tiny_batch(8, 64)
    for _ in range(3):
        consumer.step(data.to(consumer.device), labels)
        assert torch.cuda.current_stream().query(), "step returned before its kernels finished"
    report = consumer.report()
    json.dumps(report)
    assert report["device"].startswith("cuda") and report["timer"] == "cuda_event"
    for phase in ("forward", "backward", "optimizer"):
        summary = report["phases_ms"][phase]
        assert summary["n"] == 2 and summary["mean"] > 0 and summary["median"] > 0
    # GPU time between events recorded inside the host-timed region, which waits for the last one.
    assert sum(p["mean"] for p in report["phases_ms"].values()) <= report["timed_ms"]["mean"]


@NEEDS_CUDA
def test_emulated_consumer_asks_for_the_host_to_device_copy():
    assert build_consumer(spec("emulated"), 0).device == torch.device("cuda")
