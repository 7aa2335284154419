"""Selection for TRL's `SFTTrainer` (needs ``pip install "hf-selective-backprop[trl]"``).

`SFTTrainer` computes its loss with a fused LM head: per-token log-probabilities of the labels, without
the ``[batch, length, vocabulary]`` logits, over the tokens its dataset preparation left in the labels
(completion-only and assistant-only masks set the others to -100). The per-example loss here reads
the same log-probabilities, so selection ranks examples by exactly the tokens SFT trains on.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

import torch
import trl
from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available
from trl import SFTConfig, SFTTrainer
from trl.trainer.utils import get_config_model_id

from . import _compat
from .config import SelectiveBackpropArguments
from .default_strategy import DefaultChoice
from .engine.packing import (
    PackedScorer,
    SequenceRowsCollator,
    first_sequence_ids,
    packed_rows,
    per_sequence,
    sequence_counts,
    swapped,
)
from .losses import ExampleLoss
from .trainer import SelectiveBackpropMixin

_compat.warn_if_newer_than_tested("trl", trl.__version__)
logger = logging.getLogger(__name__)

__all__ = ["SFTExampleLoss", "SelectiveBackpropSFTConfig", "SelectiveBackpropSFTTrainer"]


@dataclass
class SelectiveBackpropSFTConfig(SelectiveBackpropArguments, SFTConfig):
    """TRL's `SFTConfig` plus the `sb_*` flags, for `SelectiveBackpropSFTTrainer`.

    ``bf16`` left unset is on where the hardware has bf16 (TRL turns it on whenever ``fp16`` is off, which
    transformers then refuses on a CPU with "You need to assign use_cpu"), off on a CPU, as the Trainer trains.
    """

    sb_strategy: str = field(
        # Every saving measured in SFT raised the validation loss, random subsets too (docs/results.md): SFT
        # selects only when asked.
        default=DefaultChoice("none"),
        metadata={**SelectiveBackpropArguments.__dataclass_fields__["sb_strategy"].metadata,
                  "help": SelectiveBackpropArguments.__dataclass_fields__["sb_strategy"].metadata["help"].split(
                      " Default:")[0] + " Default for SFT: 'none' (every saving measured in SFT raised the "
                      "validation loss, random subsets of the same cost too: docs/results.md)."},
    )

    def __post_init__(self):
        accelerator_bf16 = is_torch_bf16_gpu_available() or is_torch_xla_available()
        if self.bf16 is None:
            self.bf16 = accelerator_bf16 and not self.use_cpu and not self.fp16
        elif self.bf16 and not accelerator_bf16 and not self.use_cpu:
            raise ValueError(
                "--bf16 needs a GPU (or TPU) with bfloat16, which this machine lacks: leave --bf16 unset (or pass "
                "--bf16 false) to train in float32, or add --use_cpu to train with bfloat16 autocast on the CPU"
            )
        super().__post_init__()

    def _validate_sb(self) -> None:
        super()._validate_sb()
        if self.max_length is not None and self.max_length < 1:  # SFTConfig takes it: no text would fit
            raise ValueError(f"--max_length must be >= 1 (or None: no truncation), got {self.max_length}")
        if self.sb_strategy == "none":
            return
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
        #: (seq_idx [1, tokens], sequences) of a packed row while `sequences` is entered: one loss per sequence.
        self._packed: tuple[torch.Tensor, int] | None = None

    @contextlib.contextmanager
    def sequences(self, sequence_index: torch.Tensor, count: int | None = None):
        """Inside, the outputs are those of one packed (padding-free) row whose token t belongs to sequence
        ``sequence_index[0, t]`` (TRL's ``seq_idx``): one loss per sequence, ``count`` of them (all, by default)."""
        if count is None:
            count = int(sequence_index.max()) + 1 if sequence_index.numel() else 0
        saved, self._packed = self._packed, (sequence_index, count)
        try:
            yield
        finally:
            self._packed = saved

    def forward_kwargs(self, labels: torch.Tensor) -> dict:
        """What the selection forward passes besides the inputs: the labels, through the fused head."""
        return {"labels": labels, "fused_lm_head": True}

    def sums_and_counts(self, outputs, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = getattr(outputs, "log_probs", None)
        if log_probs is None:
            if self._packed is not None:
                raise ValueError("a packed row's per-sequence losses need the fused LM head's log_probs")
            return super().sums_and_counts(outputs, labels)
        tokens = -log_probs.float()
        if self.loss_type == "dft":
            tokens = tokens * log_probs.float().exp().detach()
        counts = outputs.label_mask.to(tokens.dtype)
        if self._packed is not None:
            sequence_index, count = self._packed
            return per_sequence(tokens, sequence_index, count), per_sequence(counts, sequence_index, count)
        return tokens.sum(dim=1), counts.sum(dim=1)


class SelectiveBackpropSFTTrainer(SelectiveBackpropMixin, SFTTrainer):
    """TRL's `SFTTrainer` that backpropagates only selected examples; ``args`` is a `SelectiveBackpropSFTConfig`.

    Prompt, completion-only and assistant-only masking apply to selection as to training: an example's
    loss is its mean loss over the tokens SFT trains on. With ``packing=True`` or ``padding_free=True``
    selection keeps or drops the sequences of each packed row and trains the kept ones re-packed
    (`engine.packing`; docs/text.md, "Packed SFT with selection").
    """

    config_class_name = "SelectiveBackpropSFTConfig"
    loss_scale_rule = _compat.SFT_LOSS_SCALE

    def __init__(self, model, args=None, *rest, **kwargs):
        # SFTTrainer rebuilds other TrainingArguments as an SFTConfig, which has no sb_* fields.
        if args is not None and not isinstance(args, SelectiveBackpropSFTConfig):
            raise TypeError(f"{type(self).__name__} needs args of type SelectiveBackpropSFTConfig (SFTConfig with the "
                            f"sb_* fields), got {type(args).__name__}")
        super().__init__(model, args, *rest, **kwargs)

    def default_arguments(self, model):
        # TRL's own default, SFTConfig(f"{model name}-SFT"), with the sb_* fields.
        name = model if isinstance(model, str) else get_config_model_id(model.config)
        return SelectiveBackpropSFTConfig(f"{name.split('/')[-1]}-SFT")

    def _refuse_before_data(self, args, selector, per_example_loss_func) -> None:
        super()._refuse_before_data(args, selector, per_example_loss_func)
        if selector is not None and packs_sequences(args):
            _refuse_on_packed_sequences(args, selector, per_example_loss_func)

    # ---- packed (padding-free) batches: selection keeps or drops sequences (engine/packing.py) ----

    @property
    def _packs_sequences(self) -> bool:
        """Selection on padding-free batches: split into sequences, scored packed, trained re-packed."""
        return self.selector is not None and getattr(self, "padding_free", False)

    def _can_record(self) -> bool:
        if self.selector is None and getattr(self, "padding_free", False):
            # Without selection a packed row reaches the model whole: its sequences have no loss of their own.
            logger.warning("the example record is off: without selection, packed (padding-free) rows hold several "
                           "examples each; pad them, or train with a selective --sb_strategy, to record them")
            return False
        return True

    def _sequence_rows_collator(self, collator) -> SequenceRowsCollator:
        first = first_sequence_ids(self.train_dataset, self.args.sb_index_column)
        return SequenceRowsCollator(collator, self.data_collator.pad_token_id, self.args.sb_index_column, first)

    def sequences_per_micro_batch(self) -> int:
        """Sequences a re-packed training micro-batch holds: as many as a loaded training batch holds on average
        (per_device_train_batch_size rows of the packed dataset), so a step trains as many sequences and, on
        average, tokens as one of plain packed SFT, and the run's step count (and LR schedule) is unchanged."""
        batch = _compat.train_batch_size(self)
        counts = sequence_counts(self.train_dataset)
        if counts is None or len(counts) == 0:
            return batch  # padding-free without packing: one dataset row is one sequence
        return max(round(batch * int(counts.sum()) / len(counts)), 1)

    def _selection_scorer(self):
        scorer = super()._selection_scorer()
        if not self._packs_sequences:
            return scorer
        return PackedScorer(scorer, self.data_collator.pad_token_id, self.data_collator.pad_to_multiple_of)

    def _micro_batch_rows(self) -> int:
        return self.sequences_per_micro_batch() if self._packs_sequences else super()._micro_batch_rows()

    def _check_automatic_loss(self) -> None:
        if not self._packs_sequences:
            return super()._check_automatic_loss()
        with swapped(self, "data_collator", self._sequence_rows_collator(self.data_collator)):
            return super()._check_automatic_loss()

    def get_train_dataloader(self):
        if not self._packs_sequences:
            return super().get_train_dataloader()
        with swapped(self, "data_collator", self._sequence_rows_collator(self.data_collator)):
            return super().get_train_dataloader()

    def _plans_before_loading(self, dataset) -> bool:
        if self._packs_sequences and "seq_lengths" in getattr(dataset, "column_names", ()):
            # A packed row holds several sequences: nothing is decided before loading (Stale-SB's stale epochs
            # read each sequence's stored loss once loaded instead).
            return False
        return super()._plans_before_loading(dataset)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        micro_batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self._packs_sequences:
            collator = self.data_collator
            micro_batches = [packed_rows(batch, collator.pad_token_id, collator.pad_to_multiple_of, self.label_name)
                             for batch in micro_batches]
        return micro_batches, num_items

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        sequence_index = inputs.get("seq_idx") if self._packs_sequences else None
        if sequence_index is None or not isinstance(self.per_example_loss_func, SFTExampleLoss):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        # Weights and stored losses are per sequence of the packed row.
        # The ids and weights (one per sequence; training_step set them aside) count the sequences.
        extras = [t for t in (self._step_extras.pending or ()) if t is not None]
        count = extras[0].numel() if extras else None
        with self.per_example_loss_func.sequences(sequence_index, count):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

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


def packs_sequences(args) -> bool:
    """Whether TRL's collator flattens batches (padding-free), as `SFTTrainer` decides it."""
    return bool(args.padding_free or (args.packing and args.packing_strategy in {"bfd", "bfd_split"}))


def _refuse_on_packed_sequences(args, selector, per_example_loss_func) -> None:
    """What selection on padding-free batches cannot do, refused before TRL prepares the data."""
    from .selectors import Selector

    how = "packing=True" if args.packing else "padding_free=True"
    if per_example_loss_func is not None:
        raise ValueError(
            f"per_example_loss_func with {how}: a padding-free batch is one flattened row, which selection splits into "
            "sequences with the automatic SFT loss only; leave per_example_loss_func out, or set packing=False and "
            "padding_free=False"
        )
    if selector.uses_reference_losses:
        raise ValueError(
            f"--sb_strategy {args.sb_strategy} with {how}: the reference pass scores dataset rows, which padding-free "
            "batches flatten together; set packing=False and padding_free=False"
        )
    if args.packing and type(selector).plan_epoch is not Selector.plan_epoch:
        raise ValueError(
            f"--sb_strategy {args.sb_strategy} with packing=True: it decides before loading which rows an epoch "
            "loads, and a packed row holds several sequences, so it cannot keep or drop one of them; use "
            "packing=False (padding_free=True is supported), or a strategy that selects after scoring (sb)"
        )
