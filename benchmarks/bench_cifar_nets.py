"""Seconds per image of a training step and of a no-grad forward, for the networks a CPU run can choose from.

    python benchmarks/bench_cifar_nets.py --threads 1 2 --output benchmarks/results/cifar10-paper-regime/model_choice.md

What picked the convergence-regime benchmark's network and thread count (docs/benchmarks/benchmarks.md, "Near
convergence"): SGD steps on batches of 128 random 32x32 images, after warm-up steps, on an otherwise idle
machine. The forward's share of a step bounds what selection can save (the cost model in the docs).
"""

import platform
import time
from dataclasses import dataclass, field

import timm
import torch
from transformers import HfArgumentParser

import hf_selective_backprop.cifar_nets  # noqa: F401  (registers the cifar_* networks)


@dataclass
class Arguments:
    models: list[str] = field(
        default_factory=lambda: ["cifar_resnet20", "cifar_convnet_half", "cifar_convnet", "cifar_resnet20_w2",
                                 "resnet18"],
        metadata={"help": "timm architectures to time."},
    )
    threads: list[int] = field(default_factory=lambda: [1, 2], metadata={"help": "torch thread counts to try."})
    batch_size: int = field(default=128, metadata={"help": "Images per step."})
    steps: int = field(default=6, metadata={"help": "Timed steps (after 2 warm-up steps)."})
    output: str | None = field(default=None, metadata={"help": "Also write the table to this Markdown file."})


def time_model(name: str, batch_size: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images, labels = torch.randn(batch_size, 3, 32, 32), torch.randint(0, 10, (batch_size,))

    def step():
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(2):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    per_step = (time.perf_counter() - start) / steps / batch_size
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(steps):
            model(images)
        per_forward = (time.perf_counter() - start) / steps / batch_size
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "step_ms": 1000 * per_step,
        "forward_ms": 1000 * per_forward,
    }


def main(args: Arguments) -> str:
    lines = [
        f"{platform.machine()}, {torch.get_num_threads()} default threads, torch {torch.__version__}, "
        f"batch {args.batch_size}, {args.steps} timed steps\n",
        "| network | parameters (M) | threads | training step (ms per image) | no-grad forward (ms per image) | "
        "forward / step |",
        "|---|---|---|---|---|---|",
    ]
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name in args.models:
            result = time_model(name, args.batch_size, args.steps)
            lines.append(
                f"| {name} | {result['parameters'] / 1e6:.2f} | {threads} | {result['step_ms']:.2f} | "
                f"{result['forward_ms']:.2f} | {result['forward_ms'] / result['step_ms']:.2f} |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text)
    return text


if __name__ == "__main__":
    (arguments,) = HfArgumentParser(Arguments).parse_args_into_dataclasses()
    main(arguments)
