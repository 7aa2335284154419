"""Per-example losses that match the model's own mean loss."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

#: (model outputs, labels) -> one loss per example, shape (batch,).
PerExampleLoss = Callable[[object, torch.Tensor], torch.Tensor]


def logits_of(outputs) -> torch.Tensor:
    if isinstance(outputs, dict):
        return outputs["logits"]
    return outputs.logits if hasattr(outputs, "logits") else outputs[0]


def check_class_labels(labels: torch.Tensor, num_classes: int, label_name: str = "labels") -> None:
    """Raise a ValueError naming the column if a class label is outside [0, num_classes) and not -100.

    PyTorch's own error comes from deep inside cross-entropy (an IndexError on CPU, a device-side
    assert that kills the process on CUDA) and names neither the column nor the valid range.
    """
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.dim() != 1:
        return
    bad = ((labels < 0) & (labels != -100)) | (labels >= num_classes)
    if bool(bad.any()):
        values = sorted(set(labels[bad].tolist()))
        raise ValueError(
            f"the {label_name!r} column holds {values[:5]}{' ...' if len(values) > 5 else ''}, outside the "
            f"model's {num_classes} classes: class labels must be integers in [0, {num_classes - 1}], "
            "or -100 to ignore a row"
        )


def cross_entropy_per_example(
    outputs, labels: torch.Tensor, label_smoothing: float = 0.0, label_name: str = "labels"
) -> torch.Tensor:
    """Cross-entropy per example: the mean of it over non-ignored rows is the Trainer's loss.

    Computed in float32 so a bf16 selection pass ranks examples on the same scale as fp32.
    Rows labelled -100 get loss 0, as they contribute nothing to the model's loss. Labels
    outside the logits' classes raise a ValueError naming ``label_name``.
    """
    logits = logits_of(outputs)
    if logits.dim() == 2:
        check_class_labels(labels, logits.shape[-1], label_name)
    return F.cross_entropy(
        logits.float(),
        labels,
        reduction="none",
        ignore_index=-100,
        label_smoothing=label_smoothing,
    )


def weighted_loss(
    per_example: torch.Tensor, weights: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None
) -> torch.Tensor:
    """Sum of weighted per-example losses over the model's own normaliser: the step's item count
    when the Trainer passes one (the loss is then already scaled for accumulation), else the
    batch's non-ignored rows. With all weights 1 it equals the model's mean loss."""
    denominator = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum()
    return (per_example * weights).sum() / torch.as_tensor(denominator).clamp_min(1)
