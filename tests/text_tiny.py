"""Tiny text models and padded batches for tests (built from configs: no download)."""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertForSequenceClassification,
    BertForTokenClassification,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

from hf_selective_backprop.data.text import SPECIAL_TOKENS

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


POSITIVE = ["a fine and moving film", "great acting", "superb , warm and funny", "i loved every minute"]
NEGATIVE = ["dull and poor", "an awful mess", "bad acting , worse plot", "i was bored"]


def write_split(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_review_folder(folder: Path) -> Path:
    """A local dataset in the Hub layout: 96 training rows, a 'review' column and string labels."""
    folder.mkdir()
    rows = [{"id": i, "review": text, "sentiment": label}
            for i, (text, label) in enumerate([(t, "pos") for t in POSITIVE] + [(t, "neg") for t in NEGATIVE])]
    write_split(folder / "train.csv", rows * 12)
    write_split(folder / "validation.csv", rows)
    return folder


#: Words of the sentiment sentences below: which of the first two lists has more words in a sentence is its label.
GOOD, BAD, NEUTRAL = ["good", "great", "fine", "superb"], ["bad", "awful", "dull", "poor"], ["the", "film", "was", "a"]


def sentiment_sentences(n: int = 160, seed: int = 0) -> Dataset:
    """Sentences of 2-14 words; the label says whether good words outnumber bad ones."""
    generator = torch.Generator().manual_seed(seed)
    words = GOOD + BAD + NEUTRAL
    texts, labels = [], []
    for _ in range(n):
        length = int(torch.randint(2, 15, (1,), generator=generator))
        chosen = [words[int(i)] for i in torch.randint(0, len(words), (length,), generator=generator)]
        texts.append(" ".join(chosen))
        labels.append(int(sum(w in GOOD for w in chosen) > sum(w in BAD for w in chosen)))
    return Dataset.from_dict({"text": texts, "label": labels})


def word_tokenizer(texts: list[str], max_length: int = 32) -> PreTrainedTokenizerFast:
    """``[CLS] words [SEP]`` with one id per distinct word of ``texts``.

    The same in every process, unlike a trained WordPiece vocabulary (huggingface/tokenizers#1794).
    """
    words = sorted({word for text in texts for word in text.split()})
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS.values(), *words])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=max_length, **SPECIAL_TOKENS)


def eos_word_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """One id per distinct word, ``[PAD]``/``[UNK]``/``[EOS]`` and no template: what TRL's SFT expects."""
    words = sorted({word for text in texts for word in text.split()})
    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[EOS]", *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")


def tiny_gpt2(vocab_size: int, seed: int = 0) -> GPT2LMHeadModel:
    """A GPT-2 without dropout: training runs compare bit for bit."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_positions=32, n_embd=16, n_layer=1, n_head=2, pad_token_id=PAD_ID,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def tiny_t5(tokenizer, seed: int = 0) -> T5ForConditionalGeneration:
    torch.manual_seed(seed)
    config = T5Config(vocab_size=len(tokenizer), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                      dropout_rate=0.0, pad_token_id=tokenizer.pad_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.sep_token_id)
    return T5ForConditionalGeneration(config)


def tiny_bart(tokenizer, seed: int = 0) -> BartForConditionalGeneration:
    torch.manual_seed(seed)
    config = BartConfig(vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                        max_position_embeddings=64, dropout=0.0, pad_token_id=tokenizer.pad_token_id,
                        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                        decoder_start_token_id=tokenizer.sep_token_id)
    return BartForConditionalGeneration(config)


def rholoss_reference(given_as: str, reference, folder: Path) -> tuple[dict, dict]:
    """(config overrides, trainer keyword arguments) that give RHO-LOSS ``reference`` as ``given_as`` says:
    the ``reference_model=`` object, or the folder ``--sb_reference_model`` loads it from."""
    overrides = dict(sb_strategy="rholoss", sb_keep=0.5)
    if given_as == "reference_model":
        return overrides, {"reference_model": reference}
    reference.save_pretrained(folder)
    return {**overrides, "sb_reference_model": str(folder)}, {}
