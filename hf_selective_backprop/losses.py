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


def cross_entropy_per_example(outputs, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy per example: the mean of it over non-ignored rows is the Trainer's loss.

    Computed in float32 so a bf16 selection pass ranks examples on the same scale as fp32.
    Rows labelled -100 get loss 0, as they contribute nothing to the model's loss.
    """
    return F.cross_entropy(
        logits_of(outputs).float(),
        labels,
        reduction="none",
        ignore_index=-100,
        label_smoothing=label_smoothing,
    )
