"""The ids and weights of a training micro-batch, carried from ``training_step`` to ``compute_loss``.

They travel beside the model's inputs, not in them: a ``compute_loss`` override that does not call the
mixin's (as transformers' docs show overrides) hands its inputs straight to the model, which would reject
the extra keys. What such an override leaves unread is then a clear error, not a silently unweighted step.
"""

from __future__ import annotations

import contextlib

import torch

from .engine.batch_rows import WEIGHT_KEY


class StepExtras:
    """The ``(ids, weights)`` of the micro-batch in ``training_step``, until ``compute_loss`` takes them."""

    def __init__(self, index_column: str):
        self.index_column = index_column
        self.pending: tuple[torch.Tensor | None, torch.Tensor | None] | None = None

    @contextlib.contextmanager
    def carried(self, inputs: dict, trainer_name: str, strategy: str, refreshes_store: bool):
        """Around the training step: yields ``inputs`` without the ids and weights, which wait for `take`; then
        raises if ``compute_loss`` left the weights (or the ids a store refresh needs) unread."""
        inputs = dict(inputs)
        self.pending = (inputs.pop(self.index_column, None), inputs.pop(WEIGHT_KEY, None))
        try:
            yield inputs
            ids, weights = self.pending or (None, None)
        finally:
            self.pending = None
        if weights is not None or (ids is not None and refreshes_store):
            lost = "its example weights" if weights is not None else "the refresh of its stored losses"
            raise RuntimeError(
                f"{trainer_name}.compute_loss did not call SelectiveBackpropMixin.compute_loss, so --sb_strategy "
                f"{strategy} lost {lost}: an override of compute_loss must call super().compute_loss(model, inputs, "
                "return_outputs, num_items_in_batch) (docs/usage.md, 'Overriding compute_loss')"
            )

    def take(self, inputs: dict, training: bool) -> tuple[dict, torch.Tensor | None, torch.Tensor | None]:
        """``inputs`` without the ids and weights, and those: set aside by the training step, or in ``inputs``."""
        inputs = dict(inputs)
        ids, weights = inputs.pop(self.index_column, None), inputs.pop(WEIGHT_KEY, None)
        if training and self.pending is not None:
            (ids, weights), self.pending = self.pending, None
        return inputs, ids, weights
