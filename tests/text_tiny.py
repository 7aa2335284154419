"""Tiny text models and padded batches for tests (built from configs: no download)."""

from __future__ import annotations

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertForTokenClassification,
    GPT2Config,
    GPT2LMHeadModel,
)

VOCAB, PAD_ID = 40, 0


def bert_config(**overrides) -> BertConfig:
    settings = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=32, pad_token_id=PAD_ID)
    settings.update(overrides)
    return BertConfig(**settings)


def sequence_classifier(seed: int = 0, **overrides) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(bert_config(**overrides)).eval()


def token_classifier(seed: int = 0, num_labels: int = 5) -> BertForTokenClassification:
    torch.manual_seed(seed)
    return BertForTokenClassification(bert_config(num_labels=num_labels)).eval()


def causal_lm(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=1, n_head=2, pad_token_id=PAD_ID)
    return GPT2LMHeadModel(config).eval()


def padded_batch(lengths, seed: int = 0, side: str = "right") -> dict[str, torch.Tensor]:
    """input_ids/attention_mask padded to the longest of ``lengths`` (real tokens never PAD_ID)."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.full((len(lengths), width), PAD_ID)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        columns = slice(0, length) if side == "right" else slice(width - length, width)
        input_ids[row, columns] = torch.randint(1, VOCAB, (length,), generator=generator)
        mask[row, columns] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def token_labels(batch: dict, num_labels: int, seed: int = 0) -> torch.Tensor:
    """A class per real token, -100 on padding and on a few real tokens."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_labels, batch["input_ids"].shape, generator=generator)
    labels[batch["attention_mask"] == 0] = -100
    labels[:, 1] = -100
    return labels
