"""Selection for `Seq2SeqTrainer`: encoder-decoder language models (T5, BART) with `DataCollatorForSeq2Seq`."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

from .config import SelectiveBackpropArguments
from .trainer import SelectiveBackpropMixin

__all__ = ["SelectiveBackpropSeq2SeqConfig", "SelectiveBackpropSeq2SeqTrainer"]


@dataclass
class SelectiveBackpropSeq2SeqConfig(SelectiveBackpropArguments, Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` plus the `sb_*` flags, for `SelectiveBackpropSeq2SeqTrainer`."""


class SelectiveBackpropSeq2SeqTrainer(SelectiveBackpropMixin, Seq2SeqTrainer):
    """`Seq2SeqTrainer` that backpropagates only selected examples.

    An example's loss is the mean cross-entropy over its label tokens (-100 ignored, label smoothing
    as the Trainer applies it); the labels and decoder inputs are padded again, apart from the
    source text, when kept rows of several selection batches make one training batch.
    """

    config_class_name = "SelectiveBackpropSeq2SeqConfig"

    def default_arguments(self, model):
        return SelectiveBackpropSeq2SeqConfig(output_dir="tmp_trainer")
