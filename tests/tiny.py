"""A tiny classifier and synthetic data for trainer tests (no download, sub-second steps)."""

from __future__ import annotations

import torch
from datasets import Dataset
from torch import nn

from hf_selective_backprop import SelectiveBackpropConfig

FEATURES, CLASSES = 8, 3


class TinyClassifier(nn.Module):
    """An MLP with the Trainer's conventions: (pixel_values, labels) -> {"loss", "logits"}."""

    def __init__(self, batch_norm: bool = False, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        norm = nn.BatchNorm1d(16) if batch_norm else nn.Identity()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), norm, nn.ReLU(), nn.Linear(16, CLASSES))

    def forward(self, pixel_values, labels=None):
        logits = self.net(pixel_values)
        outputs = {"logits": logits}
        if labels is not None:
            outputs["loss"] = nn.functional.cross_entropy(logits, labels)
        return outputs


def make_dataset(n: int = 256, seed: int = 0, with_index: bool = False) -> Dataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    columns = {"pixel_values": x.tolist(), "labels": y.tolist()}
    if with_index:
        columns["index"] = list(range(n))
    return Dataset.from_dict(columns).with_format("torch")


def make_config(output_dir: str, **overrides) -> SelectiveBackpropConfig:
    settings = dict(
        output_dir=output_dir,
        per_device_train_batch_size=8,
        num_train_epochs=2,
        learning_rate=0.05,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1000,
        seed=0,
    )
    settings.update(overrides)
    return SelectiveBackpropConfig(**settings)
