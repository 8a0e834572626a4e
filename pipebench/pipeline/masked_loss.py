"""The seed's masked, class-balanced loss, written twice: with host-device syncs and without.

The loss: cross-entropy over the samples whose label is kept (labels >= `keep_classes` are
"void", like the ignore label of a segmentation mask), each class weighted by the inverse of its
count in the batch, averaged over the classes present. So every present class counts alike.

- `masked_loss_sync` is how it is first written: torch.nonzero and boolean-mask indexing to
  drop void samples, torch.unique to count classes. Each makes the output's *shape* depend on
  the data, so on CUDA the CPU must wait for the GPU to learn it (a cudaMemcpyAsync of the size
  followed by cudaStreamSynchronize).
- `masked_loss_fixed` keeps every shape fixed: torch.where instead of masking, counts from a
  sort + searchsorted (no data-dependent size), and cross_entropy's ignore_index for void
  samples. No syncs.

Both return the same value on the same batch (tested on the CPU).
"""

import torch
from torch.nn import functional as F

from pipebench.config.specs import MASKED_LOSS_KINDS

# Classes 0..7 are trained on; 8 and 9 of the toy CNN's 10 are void (ignored), so with uniform
# random labels a fifth of every batch is masked out, enough that the masking is real work.
KEEP_CLASSES = 8
# cross_entropy's conventional "ignore" label.
IGNORE_INDEX = -100


def masked_loss_sync(logits: torch.Tensor, labels: torch.Tensor, keep_classes: int = KEEP_CLASSES) -> torch.Tensor:
    """Data-dependent shapes: nonzero, boolean-mask indexing and unique (each syncs on CUDA)."""
    keep = torch.nonzero(labels < keep_classes).squeeze(1)
    kept_logits = logits[keep]
    kept_labels = labels[labels < keep_classes]
    classes, inverse, counts = torch.unique(kept_labels, return_inverse=True, return_counts=True)
    per_sample = F.cross_entropy(kept_logits, kept_labels, reduction="none")
    weights = 1.0 / counts[inverse].to(per_sample.dtype)
    return (per_sample * weights).sum() / max(classes.numel(), 1)


def masked_loss_fixed(logits: torch.Tensor, labels: torch.Tensor, keep_classes: int = KEEP_CLASSES) -> torch.Tensor:
    """Fixed shapes: torch.where, sort-based counting and ignore_index (no syncs)."""
    kept = labels < keep_classes
    # Void samples are counted under the sentinel class `keep_classes`, outside 0..keep_classes-1.
    sorted_labels, _ = torch.sort(torch.where(kept, labels, keep_classes))
    class_ids = torch.arange(keep_classes, device=labels.device, dtype=sorted_labels.dtype)
    counts = (torch.searchsorted(sorted_labels, class_ids, right=True)
              - torch.searchsorted(sorted_labels, class_ids, right=False))
    targets = torch.where(kept, labels, IGNORE_INDEX)
    per_sample = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="none")
    # Void samples read count 1 (any value would do: their per-sample loss is 0).
    sample_counts = counts.gather(0, torch.where(kept, labels, 0)).clamp_min(1)
    weights = torch.where(kept, 1.0 / sample_counts.to(per_sample.dtype), 0.0)
    return (per_sample * weights).sum() / (counts > 0).sum().clamp_min(1)


MASKED_LOSSES = dict(zip(MASKED_LOSS_KINDS, (masked_loss_sync, masked_loss_fixed)))
