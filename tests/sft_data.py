"""Tiny SFT data and models for the TRL tests and their two-process worker (built locally: no download)."""

from __future__ import annotations

from datasets import Dataset
from text_tiny import NEGATIVE, POSITIVE, eos_word_tokenizer, tiny_gpt2

TEXTS = POSITIVE + NEGATIVE


def sft_tokenizer():
    return eos_word_tokenizer([*TEXTS, "review :", "good bad"])


def language_modelling(n: int = 48) -> Dataset:
    return Dataset.from_dict({"text": [TEXTS[i % len(TEXTS)] for i in range(n)]})


def prompt_completion(n: int = 48) -> Dataset:
    """A review as the prompt, its sentiment as the completion: completion-only loss by default."""
    return Dataset.from_dict({
        "prompt": ["review : " + TEXTS[i % len(TEXTS)] for i in range(n)],
        "completion": [" good" if i % len(TEXTS) < len(POSITIVE) else " bad" for i in range(n)],
    })


def sft_model(tokenizer, seed: int = 0):
    return tiny_gpt2(len(tokenizer), seed)
