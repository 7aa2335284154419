"""Selection for TRL's `SFTTrainer` (needs ``pip install "hf-selective-backprop[trl]"``).

`SFTTrainer` computes its loss with a fused LM head: per-token log-probabilities of the labels, without
the ``[batch, length, vocabulary]`` logits, over the tokens its dataset preparation left in the labels
(completion-only and assistant-only masks set the others to -100). The per-example loss here reads
the same log-probabilities, so selection ranks examples by exactly the tokens SFT trains on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from trl import SFTConfig, SFTTrainer

from . import _compat
from .config import SelectiveBackpropArguments
from .losses import ExampleLoss
from .trainer import SelectiveBackpropMixin

__all__ = ["SFTExampleLoss", "SelectiveBackpropSFTConfig", "SelectiveBackpropSFTTrainer"]


@dataclass
class SelectiveBackpropSFTConfig(SelectiveBackpropArguments, SFTConfig):
    """TRL's `SFTConfig` plus the `sb_*` flags, for `SelectiveBackpropSFTTrainer`."""

    def _validate_sb(self) -> None:
        super()._validate_sb()
        if self.sb_strategy == "none":
            return
        # A packed (or padding-free) row holds several examples, or a whole batch flattened into one row.
        for flag in ("packing", "padding_free"):
            if getattr(self, flag):
                raise ValueError(
                    f"{flag}=True puts several examples in one row, and selection keeps or drops single "
                    f"examples: set {flag}=False (the examples are padded instead), or --sb_strategy none "
                    "to train packed without selection"
                )
        if self.label_smoothing_factor > 0:
            raise ValueError(
                "label_smoothing_factor is deprecated in TRL's SFTTrainer and not supported with selection, whose "
                "per-example loss reads the fused LM head's log-probabilities: set it to 0, or --sb_strategy none"
            )


class SFTExampleLoss(ExampleLoss):
    """Each example's mean negative log-likelihood over its label tokens, as `SFTTrainer` computes it.

    From the fused LM head's ``log_probs`` and ``label_mask`` (both [batch, length - 1], zero and False
    where the shifted label is -100); ``loss_type="dft"`` weighs each token's loss by its probability,
    as TRL does. Outputs with logits (a ``compute_loss_func``) fall back to the causal-LM loss.
    """

    def __init__(self, loss_type: str = "nll", config=None, label_name: str = "labels"):
        super().__init__("causal-lm", config, 0.0, label_name)
        self.loss_type = loss_type

    def forward_kwargs(self, labels: torch.Tensor) -> dict:
        """What the selection forward passes besides the inputs: the labels, through the fused head."""
        return {"labels": labels, "fused_lm_head": True}

    def sums_and_counts(self, outputs, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = getattr(outputs, "log_probs", None)
        if log_probs is None:
            return super().sums_and_counts(outputs, labels)
        tokens = -log_probs.float()
        if self.loss_type == "dft":
            tokens = tokens * log_probs.float().exp().detach()
        return tokens.sum(dim=1), outputs.label_mask.sum(dim=1).to(tokens.dtype)


class SelectiveBackpropSFTTrainer(SelectiveBackpropMixin, SFTTrainer):
    """TRL's `SFTTrainer` that backpropagates only selected examples; ``args`` is a `SelectiveBackpropSFTConfig`.

    Prompt, completion-only and assistant-only masking apply to selection as to training: an example's
    loss is its mean loss over the tokens SFT trains on.
    """

    config_class_name = "SelectiveBackpropSFTConfig"
    loss_scale_rule = _compat.SFT_LOSS_SCALE

    def __init__(self, model, args=None, *rest, **kwargs):
        # SFTTrainer rebuilds other TrainingArguments as an SFTConfig, which has no sb_* fields.
        if args is not None and not isinstance(args, SelectiveBackpropSFTConfig):
            raise TypeError(f"{type(self).__name__} needs args of type SelectiveBackpropSFTConfig (SFTConfig with the "
                            f"sb_* fields), got {type(args).__name__}")
        super().__init__(model, args, *rest, **kwargs)

    def _automatic_per_example_loss(self, label_smoothing: float):
        return SFTExampleLoss(self.args.loss_type, getattr(self.model, "config", None), self.label_name)

    def _queue_padding(self, token_labels: bool, encoder_decoder: bool) -> dict:
        padding = super()._queue_padding(token_labels, encoder_decoder)
        if padding:
            # TRL's collator pads on the right, whatever the tokenizer's side.
            padding["padding_side"] = "right"
        return padding

    def _loss_and_outputs(self, model, inputs, num_items_in_batch):
        # Asked for outputs, SFTTrainer runs a second forward for the full logits. Its loss comes from its
        # first forward (the fused head's log-probabilities, or the logits for a compute_loss_func): keep those.
        captured = []
        module = self.accelerator.unwrap_model(model)
        handle = module.register_forward_hook(lambda _module, _args, output: captured.append(output))
        try:
            loss = SFTTrainer.compute_loss(self, model, inputs, False, num_items_in_batch)
        finally:
            handle.remove()
        return loss, captured[0]
