"""What a benchmark trains: the data, loaded once and shared by every run, and a fresh model per run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Workload:
    """One dataset and model family; `build_model()` returns a new model (called after the run's seed is set)."""

    train: torch.utils.data.Dataset
    eval: torch.utils.data.Dataset | None
    dataset_id: str
    model_name: str
    build_model: Callable[[], torch.nn.Module]
    data_collator: Callable | None = None
    processing_class: object | None = None


def image_workload(data_args, model_args, seed: int) -> Workload:
    """Images decoded once and augmented per batch (``seed`` seeds the augmentation); a timm model."""
    from hf_selective_backprop.data import load_image_data
    from hf_selective_backprop.models import build_model, pretrained_statistics

    data = load_image_data(data_args, seed=seed, statistics=pretrained_statistics(model_args))
    return Workload(
        train=data.train,
        eval=data.eval,
        dataset_id=data.dataset_id,
        model_name=model_args.name,
        build_model=lambda: build_model(
            model_args, data.num_labels, data.image_size, data.mean, data.std, data.num_channels, data.label_names
        ),
    )


def text_workload(data_args, model_args, seed: int) -> Workload:
    """Text tokenized once (a WordPiece tokenizer trained on the training split unless one is named).

    Rows stay unpadded: `DataCollatorWithPadding` pads each selection batch, the trainer each
    training micro-batch. ``seed`` is unused (no augmentation); it is the loaders' common signature.
    """
    from transformers import DataCollatorWithPadding

    from hf_selective_backprop.data.text import load_text_data, texts_of, tokenize, train_wordpiece_tokenizer
    from hf_selective_backprop.text_models import build_text_model, fitted_max_length, load_tokenizer

    if data_args.task != "text-classification":
        raise ValueError(f"--task {data_args.task!r}: the benchmark measures accuracy, use text-classification")
    data = load_text_data(data_args)
    if data.eval is None:
        raise ValueError("the benchmark evaluates after every epoch: give an --eval_split")
    tokenizer = load_tokenizer(model_args)
    if tokenizer is None:
        texts = texts_of(data.train, data.text_column, data_args.text_pair_column, max_length=data_args.max_length)
        tokenizer = train_wordpiece_tokenizer(texts, model_args.vocab_size, data_args.max_length)
    max_length = fitted_max_length(data_args.max_length, tokenizer)
    columns = dict(label_column=data.label_column, text_pair_column=data_args.text_pair_column)
    train = tokenize(data.train, tokenizer, data.text_column, max_length, **columns)
    evaluation = tokenize(data.eval, tokenizer, data.text_column, max_length, **columns)
    if model_args.model_name_or_path is not None:
        name = model_args.model_name_or_path
    else:
        name = f"bert-{model_args.num_layers}x{model_args.hidden_size} (from scratch, {len(tokenizer)} WordPiece)"
    return Workload(
        train=train,
        eval=evaluation,
        dataset_id=data.dataset_id,
        model_name=name,
        build_model=lambda: build_text_model(
            model_args, tokenizer, data_args.task, max_length, data.label_names
        ),
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
    )


def cifar10_workload(data: str, max_train_samples: int | None, seed: int = 0) -> Workload:
    """CIFAR-10 (a folder in the Hub's layout, or a Hub id) decoded once and augmented per batch, its test split
    capped at 2,000 images, and timm resnet18: the GPU check's workload (benchmarks/gpu_diagnostics.py,
    benchmarks/gpu_throughput.py), as the CPU benchmarks build it."""
    from hf_selective_backprop.data import DataArguments
    from hf_selective_backprop.models import ModelArguments

    data_args = DataArguments(dataset=data, eval_split="test", max_train_samples=max_train_samples,
                              max_eval_samples=2000)
    return image_workload(data_args, ModelArguments(model="resnet18"), seed)
