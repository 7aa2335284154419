"""What deciding before loading saves: uniform and Stale-SB, planned vs decided after loading, side by side.

Runs alternate (planned, after loading, planned, ...) on one process; each trains resnet18 on CIFAR-10
images for two epochs (Stale-SB n = 2: the second epoch is stale). "After loading" is how these epochs
ran before decisions moved in front of the loader: every example loaded and augmented, then dropped.
Two datasets: the workflow's decoded uint8 tensors (augmentation only), and rows decoded from PNG
per example (as a `datasets` image column with a per-example transform loads them).

    python benchmarks/bench_before_loading.py --data ../shared/data/cifar10 \
        --output_dir benchmarks/results/before-loading
"""

from __future__ import annotations

import io
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import numpy
import torch
from PIL import Image
from transformers import HfArgumentParser

from harness.provenance import provenance
from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.data import DataArguments, load_image_data
from hf_selective_backprop.engine import SelectionEngine
from hf_selective_backprop.models import ModelArguments, build_model


@dataclass
class Arguments:
    data: str = field(default="cifar10", metadata={"help": "--dataset of the image workflow."})
    examples: int = field(default=2560, metadata={"help": "Training examples."})
    rounds: int = field(default=3, metadata={"help": "Alternated rounds per pair."})
    threads: int = field(default=2, metadata={"help": "torch.set_num_threads."})
    output_dir: str = field(default="benchmarks/results/before-loading")


class PngRows(torch.utils.data.Dataset):
    """Each row decoded from PNG bytes and normalised when loaded, one example at a time."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.png = []
        for image in images:
            buffer = io.BytesIO()
            Image.fromarray(image.permute(1, 2, 0).numpy()).save(buffer, format="PNG")
            self.png.append(buffer.getvalue())
        self.labels = labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        pixels = torch.from_numpy(numpy.array(Image.open(io.BytesIO(self.png[i])))).permute(2, 0, 1)
        return {"pixel_values": pixels.float().div(255).sub(0.5).div(0.25), "labels": self.labels[i]}


def run(dataset, data, strategy: dict, planned: bool) -> float:
    """Examples consumed per second of training (two epochs)."""
    original = SelectionEngine.plans_before_loading
    if not planned:
        SelectionEngine.plans_before_loading = property(lambda self: False)
    try:
        model = build_model(ModelArguments(model="resnet18"), data.num_labels, data.image_size, data.mean, data.std,
                            data.num_channels, data.label_names)
        with tempfile.TemporaryDirectory() as folder:
            config = SelectiveBackpropConfig(
                output_dir=folder, use_cpu=True, per_device_train_batch_size=128, num_train_epochs=2,
                learning_rate=0.05, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
                seed=0, **strategy,
            )
            trainer = SelectiveBackpropTrainer(model=model, args=config, train_dataset=dataset)
            start = time.perf_counter()
            trainer.train()
            seconds = time.perf_counter() - start
        return trainer.sb_stats["examples_seen"] / seconds
    finally:
        SelectionEngine.plans_before_loading = original


def main() -> None:
    (args,) = HfArgumentParser(Arguments).parse_args_into_dataclasses()
    torch.set_num_threads(args.threads)
    data = load_image_data(DataArguments(dataset=args.data, max_train_samples=args.examples, eval_split=None), seed=0)
    datasets = {"decoded tensors": data.train, "PNG per example": PngRows(data.train.images, data.train.labels)}
    strategies = {
        "uniform keep 1/3": dict(sb_strategy="uniform", sb_keep=1 / 3),
        "Stale-SB n=2 keep 1/3": dict(sb_strategy="sb", sb_keep=1 / 3, sb_staleness=2),
    }
    results = []
    for data_name, dataset in datasets.items():
        for name, strategy in strategies.items():
            speeds = {True: [], False: []}
            for _ in range(args.rounds):
                for planned in (True, False):
                    speeds[planned].append(run(dataset, data, strategy, planned))
            ratio = statistics.median(a / b for a, b in zip(speeds[True], speeds[False], strict=True))
            results.append({"data": data_name, "strategy": name, "planned": speeds[True],
                            "after_loading": speeds[False], "speedup": ratio})
            print(f"{data_name} | {name} | planned {statistics.median(speeds[True]):.0f} ex/s | after loading "
                  f"{statistics.median(speeds[False]):.0f} ex/s | {ratio:.2f}x", flush=True)
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "results.json"), "w") as handle:
        json.dump({"results": results, "args": vars(args), "provenance": provenance()}, handle, indent=2)


if __name__ == "__main__":
    main()
