"""The masked-loss pair: same value and gradients on the CPU, shapes that do (sync) or do not (fixed)
depend on the data, consumers that train, and (on a GPU) syncs counted only for the first."""

import json

import pytest
import torch
from torch.nn import functional as F

from cuda_marks import NEEDS_CUDA
from pipebench.config.specs import CONSUMER_KINDS, ConsumerSpec
from pipebench.measure.gpu.sync_detect import count_sync_warnings
from pipebench.pipeline.consumers import ToyCnnConsumer, build_consumer
from pipebench.pipeline.masked_loss import (
    IGNORE_INDEX,
    KEEP_CLASSES,
    masked_loss_fixed,
    masked_loss_sync,
)

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

CLASSES = 10


def batch(n, seed, labels=None):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, CLASSES, generator=g)
    if labels is None:
        labels = torch.randint(0, CLASSES, (n,), generator=g)
    return logits, torch.as_tensor(labels)


def by_hand(logits, labels):
    """The definition, one class at a time: mean CE within each kept class, averaged over classes."""
    per_class = [F.cross_entropy(logits[labels == c], labels[labels == c]) for c in range(KEEP_CLASSES)
                 if (labels == c).any()]
    return torch.stack(per_class).mean() if per_class else torch.tensor(0.0)


@pytest.mark.parametrize("n, seed, labels", [
    (32, 0, None), (256, 1, None), (7, 2, None),
    (6, 3, [0, 0, 0, 0, 0, 1]),            # unbalanced: class 1 weighs as much as five 0s
    (5, 4, [9, 8, 9, 8, 9]),               # every sample void
    (4, 5, [3, 3, 3, 3]),                  # one class
])
def test_both_variants_compute_the_same_loss_and_gradients(n, seed, labels):
    logits, labels = batch(n, seed, labels)
    expected = by_hand(logits, labels)
    results = []
    for fn in (masked_loss_sync, masked_loss_fixed):
        x = logits.clone().requires_grad_(True)
        loss = fn(x, labels)
        loss.backward()
        results.append((loss.detach(), x.grad))
    (sync_loss, sync_grad), (fixed_loss, fixed_grad) = results
    assert sync_loss == pytest.approx(float(expected), rel=1e-5, abs=1e-7)
    assert fixed_loss == pytest.approx(float(sync_loss), rel=1e-6, abs=1e-7)
    assert torch.allclose(sync_grad, fixed_grad, rtol=1e-5, atol=1e-7)


def test_void_samples_do_not_move_the_loss():
    logits, labels = batch(16, 6, [c % KEEP_CLASSES for c in range(16)])
    noisy = logits.clone()
    void = torch.tensor([KEEP_CLASSES, KEEP_CLASSES + 1])
    both = torch.cat([logits, torch.randn(2, CLASSES) * 100]), torch.cat([labels, void])
    for fn in (masked_loss_sync, masked_loss_fixed):
        assert fn(*both) == pytest.approx(float(fn(noisy, labels)), rel=1e-6)
    assert IGNORE_INDEX < 0


def test_only_the_sync_variant_needs_data_dependent_shapes():
    """Meta tensors have shapes but no data: an op whose output shape depends on the data (the
    property that makes the CPU wait for the GPU) cannot run on them. The fixed variant runs."""
    logits = torch.empty(32, CLASSES, device="meta")
    labels = torch.empty(32, dtype=torch.long, device="meta")
    assert masked_loss_fixed(logits, labels).shape == ()
    with pytest.raises(NotImplementedError):
        masked_loss_sync(logits, labels)


def spec(kind):
    return ConsumerSpec(kind, 0.0, "fixed", 0.0, 0.05, 0.9, "cpu")


def images(n=16, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def test_both_consumers_train_the_toy_cnn_from_the_same_first_loss():
    assert {"masked_loss_sync", "masked_loss_fixed"} <= set(CONSUMER_KINDS)
    data, labels = images(8)
    reports = {}
    for kind in ("masked_loss_sync", "masked_loss_fixed"):
        consumer = build_consumer(spec(kind), seed=0)
        assert isinstance(consumer, ToyCnnConsumer)
        for _ in range(30):
            consumer.step(data, labels)
        reports[kind] = consumer.report()
        json.dumps(reports[kind])
    sync, fixed = reports["masked_loss_sync"], reports["masked_loss_fixed"]
    assert sync["kind"] == "masked_loss_sync" and fixed["kind"] == "masked_loss_fixed"
    assert sync["loss_first"] == pytest.approx(fixed["loss_first"], rel=1e-6)
    # Same weights, same batches, same loss: training follows the same path.
    assert sync["loss_last"] == pytest.approx(fixed["loss_last"], rel=1e-3)
    assert sync["loss_last"] < 0.9 * sync["loss_first"], sync


@NEEDS_CUDA
@pytest.mark.parametrize("kind, expect_syncs", [("masked_loss_sync", True), ("masked_loss_fixed", False)])
def test_sync_debug_mode_counts_syncs_only_in_the_sync_variant(kind, expect_syncs):
    consumer = build_consumer(ConsumerSpec(kind, 0.0, "fixed", 0.0, 0.01, 0.9, "cuda"), seed=0)
    data, labels = images(32, 32)
    data = data.cuda()
    consumer.step(data, labels)  # builds the model and the CUDA context outside the count
    count = count_sync_warnings(lambda: consumer.step(data, labels), steps=3)
    if expect_syncs:
        assert count.per_step >= 3, count  # nonzero, boolean mask, unique
        assert any("masked_loss.py" in site for site in count.ops), count.ops
    else:
        assert count.syncs == 0, count.ops
