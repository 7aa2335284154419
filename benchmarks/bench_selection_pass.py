"""What the selection forward costs (phi), and SB's measured vs ideal throughput on this machine.

Part 1 (micro-benchmark, interleaved A B C ... A B C, medians over repeats): on one batch of
one model, the time of a training step (forward + backward + gradient clipping + SGD step,
train mode, as the Trainer does) = (1+r)F, of a training forward alone = F, and of the
selection forward under each option of `SelectionScorer` (the code the trainer runs).
phi = selection time per example / training forward time per example; r = step / F - 1
(backward, clipping and optimizer step, per forward).

Part 2 (trainer throughput, runs alternated A B C D A B C D): `SelectiveBackpropTrainer` on a
synthetic (or CIFAR-10) dataset of ``train_selection_batches x batch_size`` examples for
'none' (Traditional), 'sb', 'sb' with the fastest selection option of part 1, and Stale-SB
over ``staleness`` epochs, each trained and timed by the benchmark harness
(`harness.runner.time_training`: the time-to-accuracy runs'
configuration and clock, from the training loop's start to the last epoch's end). Reports
examples consumed per second relative to Traditional next to the cost model's ideal
(1+r) / (phi + s(1+r)) and (1+r) / (phi/n + s(1+r)), with the measured phi and r of part 1 and
s = each run's trained fraction (backwards / examples).

    python benchmarks/bench_selection_pass.py --data path/to/cifar10 --train_rounds 9 \
        --output_dir benchmarks/results/selection-pass
"""

from __future__ import annotations

import copy
import json
import os
import platform
import statistics
from dataclasses import asdict, dataclass, field

# On a shared 2-core machine, OpenMP threads that spin while waiting make every op up to ~10x
# slower as soon as another process wants a core; passive waiting keeps 2 threads usable.
# Must be set before torch starts its thread pool; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import HfArgumentParser  # noqa: E402

from harness.cost_model import forward_from_step, ideal_speedup, phi_from_times  # noqa: E402
from harness.provenance import provenance  # noqa: E402
from harness.runner import time_training  # noqa: E402
from harness.settings import RunSettings  # noqa: E402
from harness.strategies import Strategy  # noqa: E402
from harness.timing import timed  # noqa: E402
from hf_selective_backprop.data.datasets import ImageTensorDataset  # noqa: E402
from hf_selective_backprop.data.transforms import BatchTransform  # noqa: E402
from hf_selective_backprop.engine.scoring import SelectionScorer  # noqa: E402
from hf_selective_backprop.losses import cross_entropy_per_example  # noqa: E402
from hf_selective_backprop.models import ModelArguments, build_model  # noqa: E402

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


@dataclass
class BenchArguments:
    output_dir: str = field(default="benchmarks/results/selection-pass", metadata={"help": "Where results.json goes."})
    model: str = field(default="resnet18", metadata={"help": "timm architecture (through build_model)."})
    image_size: int = field(default=32)
    num_classes: int = field(default=10)
    batch_size: int = field(default=128, metadata={"help": "Training batch (and default selection batch)."})
    large_selection_batch: int = field(default=512, metadata={"help": "The larger selection batch measured."})
    repeats: int = field(default=15, metadata={"help": "Interleaved rounds of the micro-benchmark."})
    threads: int = field(default=2, metadata={"help": "torch.set_num_threads."})
    data: str = field(
        default="random",
        metadata={"help": "'random' uint8 images, or a CIFAR-10 folder in the Hub layout (../shared/data/cifar10)."},
    )
    augment: bool = field(default=True, metadata={"help": "Part 2: random crop + flip per batch (CIFAR recipe)."})
    train_selection_batches: int = field(default=20, metadata={"help": "Part 2: dataset = this many batches."})
    train_rounds: int = field(default=5, metadata={"help": "Part 2: rounds of the alternated runs."})
    keep: float = field(default=1 / 3, metadata={"help": "Part 2: --sb_keep."})
    staleness: int = field(default=3, metadata={"help": "Part 2: n of the Stale-SB run (trained n epochs)."})
    learning_rate: float = field(default=0.01)
    skip_training: bool = field(default=False, metadata={"help": "Only part 1."})
    seed: int = field(default=0)


# ---- part 1: the micro-benchmark --------------------------------------------------------------------

#: Selection-pass options: name -> the SelectiveBackpropConfig flags that ask for them.
OPTIONS = {
    "no_grad fp32 (default)": {},
    "inference_mode": {"sb_selection_inference_mode": True},
    "bf16 autocast": {"sb_selection_precision": "bf16"},
    "channels_last": {"sb_selection_channels_last": True},
    "scale 0.5": {"sb_selection_scale": 0.5},
    "inference_mode + bf16": {"sb_selection_inference_mode": True, "sb_selection_precision": "bf16"},
    "inference_mode + bf16 + channels_last": {
        "sb_selection_inference_mode": True,
        "sb_selection_precision": "bf16",
        "sb_selection_channels_last": True,
    },
    "inference_mode + bf16 + scale 0.5": {
        "sb_selection_inference_mode": True,
        "sb_selection_precision": "bf16",
        "sb_selection_scale": 0.5,
    },
    "inference_mode + bf16 + channels_last + scale 0.5": {
        "sb_selection_inference_mode": True,
        "sb_selection_precision": "bf16",
        "sb_selection_channels_last": True,
        "sb_selection_scale": 0.5,
    },
}
FULL_RESOLUTION_COMBO = "inference_mode + bf16 + channels_last"
SCALED_COMBO = "inference_mode + bf16 + channels_last + scale 0.5"


def scorer_for(flags: dict) -> SelectionScorer:
    return SelectionScorer(
        cross_entropy_per_example,
        precision=flags.get("sb_selection_precision", "fp32"),
        scale=flags.get("sb_selection_scale", 1.0),
        channels_last=flags.get("sb_selection_channels_last", False),
        inference_mode=flags.get("sb_selection_inference_mode", False),
    )


def make_model(args: BenchArguments):
    torch.manual_seed(args.seed)
    return build_model(ModelArguments(model=args.model), args.num_classes, args.image_size, CIFAR_MEAN, CIFAR_STD)


def load_images(args: BenchArguments, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n uint8 images (N, 3, H, W) and labels: random, or the first n of a CIFAR-10 folder."""
    if args.data == "random":
        generator = torch.Generator().manual_seed(args.seed)
        images = torch.randint(0, 256, (n, 3, args.image_size, args.image_size), dtype=torch.uint8, generator=generator)
        return images, torch.randint(args.num_classes, (n,), generator=generator)
    from hf_selective_backprop.data import DataArguments, load_image_data

    data = load_image_data(DataArguments(dataset=args.data, max_train_samples=n, eval_split="none", augment=False))
    if len(data.train) < n:
        raise ValueError(f"{args.data} has only {len(data.train)} training images, {n} needed")
    return data.train.images, data.train.labels


def micro_benchmark(args: BenchArguments) -> dict:
    model = make_model(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    images, labels = load_images(args, max(args.batch_size, args.large_selection_batch))
    normalize = BatchTransform(CIFAR_MEAN, CIFAR_STD)
    batch = {"pixel_values": normalize(images[: args.batch_size]), "labels": labels[: args.batch_size]}
    large = {
        "pixel_values": normalize(images[: args.large_selection_batch]),
        "labels": labels[: args.large_selection_batch],
    }

    def train_step():
        # What the Trainer's step does by default: backward, clip to max_grad_norm 1, SGD step.
        model.train()
        optimizer.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    def train_forward():
        model.train()
        loss = model(**batch).loss  # the graph is built, as in a training step
        del loss

    # name -> (callable, examples per call)
    cases = {
        "train step (fwd+bwd+clip+SGD)": (train_step, args.batch_size),
        "train forward": (train_forward, args.batch_size),
    }
    for name, flags in OPTIONS.items():
        scorer = scorer_for(flags)
        cases[f"select: {name}"] = (lambda s=scorer: s(model, batch), args.batch_size)
    for name in ("no_grad fp32 (default)", FULL_RESOLUTION_COMBO, SCALED_COMBO):
        scorer = scorer_for(OPTIONS[name])
        cases[f"select: {name}, batch {args.large_selection_batch}"] = (
            lambda s=scorer: s(model, large),
            args.large_selection_batch,
        )

    for fn, _ in cases.values():  # warm-up: oneDNN primitives, allocator
        for _ in range(3):
            fn()
    times = {name: [] for name in cases}
    names = list(cases)
    device = next(model.parameters()).device
    for round_ in range(args.repeats):
        # Interleaved, and the order rotated every round so no case always follows the same one.
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(timed(cases[name][0], device))

    fidelity = rank_fidelity(model, batch)
    forward = statistics.median(times["train forward"]) / args.batch_size
    rows = {}
    for name, (_, examples) in cases.items():
        median = statistics.median(times[name])
        quartiles = statistics.quantiles(times[name], n=4)
        rows[name] = {
            "median_ms": 1000 * median,
            "iqr_ms": 1000 * (quartiles[2] - quartiles[0]),
            "us_per_example": 1e6 * median / examples,
            "relative_to_forward": median / examples / forward,
            "examples": examples,
        }
        key = name.removeprefix("select: ").split(", batch")[0]
        if name.startswith("select: ") and ", batch" not in name:
            rows[name]["rank_correlation_vs_fp32"] = fidelity.get(key)
    r = rows["train step (fwd+bwd+clip+SGD)"]["relative_to_forward"] - 1.0
    selection = {k: v for k, v in rows.items() if k.startswith("select: ")}
    best = min(selection, key=lambda k: selection[k]["relative_to_forward"])
    best_full = min((k for k in selection if "scale" not in k), key=lambda k: selection[k]["relative_to_forward"])
    return {"rows": rows, "r": r, "best": best, "best_full_resolution": best_full}


def rank_fidelity(model, batch) -> dict:
    """Spearman correlation of each option's per-example losses with the fp32 ones (one batch)."""
    reference = scorer_for({})(model, batch)
    out = {}
    for name, flags in OPTIONS.items():
        losses = scorer_for(flags)(model, batch)
        out[name] = float(torch.corrcoef(torch.stack([_ranks(reference), _ranks(losses)]))[0, 1])
    return out


def _ranks(x: torch.Tensor) -> torch.Tensor:
    ranks = torch.empty_like(x)
    ranks[x.argsort()] = torch.arange(len(x), dtype=x.dtype)
    return ranks


def option_flags(case_name: str) -> dict:
    """SelectiveBackpropConfig flags of a micro-benchmark case ('select: <option>[, batch N]')."""
    name, _, batch = case_name.removeprefix("select: ").partition(", batch ")
    flags = dict(OPTIONS[name])
    if batch:
        flags["sb_selection_batch_size"] = int(batch)
    return flags


# ---- part 2: throughput of the trainer ----------------------------------------------------------------


def run_training(args: BenchArguments, dataset, initial_state: dict, model, name: str, run: dict) -> dict:
    """One timed run from the same initial weights, through the benchmark harness (`time_training`)."""
    model.load_state_dict(initial_state)
    settings = RunSettings(
        output_dir="",  # time_training trains in a scratch folder of its own
        num_train_epochs=run["epochs"],
        seed=args.seed,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        use_cpu=True,  # part 1 measured phi and r on the CPU; the ideal needs part 2 on the same device
    )
    strategy = Strategy(name, name, {"sb_keep": args.keep, **run["flags"]})
    return time_training(strategy, settings, model, dataset, run["epochs"])


def throughput(args: BenchArguments, micro: dict) -> dict:
    n = args.train_selection_batches * args.batch_size
    images, labels = load_images(args, n)
    transform = BatchTransform(CIFAR_MEAN, CIFAR_STD, augment=args.augment, hflip=args.augment, seed=args.seed)
    dataset = ImageTensorDataset(images, labels, transform, torch.arange(n))
    model = make_model(args)
    initial_state = copy.deepcopy(model.state_dict())
    best_flags = option_flags(micro["best"])
    runs = {
        "none": {"flags": {"sb_strategy": "none"}, "epochs": 1, "phi_case": None},
        "sb": {"flags": {"sb_strategy": "sb"}, "epochs": 1, "phi_case": "select: no_grad fp32 (default)"},
        "sb + best option": {"flags": {"sb_strategy": "sb", **best_flags}, "epochs": 1, "phi_case": micro["best"]},
        f"stale-sb n={args.staleness}": {
            "flags": {"sb_strategy": "sb", "sb_staleness": args.staleness},
            "epochs": args.staleness,
            "phi_case": "select: no_grad fp32 (default)",
        },
    }
    results = {name: [] for name in runs}
    # Warm-up run (kernels, allocator), not timed.
    run_training(args, dataset, initial_state, model, "warm-up", {"flags": {"sb_strategy": "sb"}, "epochs": 1})
    for round_ in range(args.train_rounds):
        for name, run in runs.items():
            result = run_training(args, dataset, initial_state, model, name, run)
            results[name].append(result)
            print(f"round {round_} {name}: {result['examples_per_second']:.0f} examples/s", flush=True)
    r = micro["r"]
    table = {}
    for name, run in runs.items():
        ratios = [
            mine["examples_per_second"] / base["examples_per_second"]
            for mine, base in zip(results[name], results["none"], strict=True)
        ]
        s = statistics.median(res["trained"] / res["examples"] for res in results[name])
        if run["phi_case"] is None:
            phi, ideal = 0.0, 1.0
        else:
            phi = micro["rows"][run["phi_case"]]["relative_to_forward"]
            # Stale-SB scores about 1/n of the examples it reads.
            ideal = ideal_speedup(r, phi, kept=s, scored=1 / run["flags"].get("sb_staleness", 1))
        measured = statistics.median(ratios)
        breakdown, in_run_phi = {}, None
        if run["phi_case"] is not None:  # a selective run: Traditional has no selection time to split
            for key in ("data_seconds", "selection_forward_seconds", "selection_overhead_seconds", "training_seconds"):
                breakdown[key] = statistics.median(res["stats"][key] for res in results[name])
            breakdown["train_seconds"] = statistics.median(res["stats"]["train_seconds"] for res in results[name])
            # phi as this run saw it: selection-forward seconds per scored example over the
            # Traditional run's seconds per example of the same round, times (1 + r).
            in_run_phi = statistics.median(
                phi_from_times(
                    mine["stats"]["selection_forward_seconds"],
                    max(mine["stats"]["selection_forwards"], 1),
                    forward_from_step(base["wall_seconds"] / base["examples"], r),
                )
                for mine, base in zip(results[name], results["none"], strict=True)
            )
        table[name] = {
            "examples_per_second": statistics.median(res["examples_per_second"] for res in results[name]),
            "ratio_vs_none": measured,
            "ratios": ratios,
            "trained_fraction": s,
            "phi": phi,
            "in_run_phi": in_run_phi,
            "ideal_ratio": ideal,
            "ideal_ratio_at_nominal_keep": 1.0
            if run["phi_case"] is None
            else ideal_speedup(r, phi, kept=args.keep, scored=1 / run["flags"].get("sb_staleness", 1)),
            "measured_over_ideal": measured / ideal,
            "loop_seconds": statistics.median(res["wall_seconds"] for res in results[name]),
            "breakdown_seconds": breakdown,
            "flags": run["flags"],
            "epochs": run["epochs"],
        }
    return table


# ---- report -----------------------------------------------------------------------------------------------


def markdown(args: BenchArguments, micro: dict, train: dict | None) -> str:
    lines = [
        f"model {args.model}, {args.image_size}x{args.image_size}, {args.num_classes} classes, batch "
        f"{args.batch_size}, {args.threads} threads, data {args.data}, {args.repeats} interleaved rounds (medians)",
        "",
        "| pass | ms / call (IQR) | us / example | / training forward | rank corr. vs fp32 |",
        "|---|---|---|---|---|",
    ]
    for name, row in micro["rows"].items():
        corr = row.get("rank_correlation_vs_fp32")
        lines.append(
            f"| {name} | {row['median_ms']:.1f} ({row['iqr_ms']:.1f}) | {row['us_per_example']:.0f} | "
            f"{row['relative_to_forward']:.2f} | {'' if corr is None else f'{corr:.3f}'} |"
        )

    def phi(case: str) -> str:
        return f"{micro['rows'][case]['relative_to_forward']:.2f}"

    lines += [
        "",
        f"r = step / forward - 1 = {micro['r']:.2f}; phi of the default selection pass = "
        f"{phi('select: no_grad fp32 (default)')}; best: {micro['best']} (phi {phi(micro['best'])}); "
        f"best at full resolution: {micro['best_full_resolution']} (phi {phi(micro['best_full_resolution'])})",
    ]
    if train:
        lines += [
            "",
            f"Trainer throughput: {args.train_selection_batches} selection batches of {args.batch_size} "
            f"({args.train_selection_batches * args.batch_size} examples), keep {args.keep:.3f}, "
            f"{args.train_rounds} alternated rounds (medians of per-round ratios)",
            "",
            "| run | epochs | examples/s | vs none (measured) | trained fraction s | phi (part 1) | phi (in run) "
            "| ideal | measured / ideal |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, row in train.items():
            in_run = "" if row["in_run_phi"] is None else f"{row['in_run_phi']:.2f}"
            lines.append(
                f"| {name} | {row['epochs']} | {row['examples_per_second']:.0f} | {row['ratio_vs_none']:.2f} | "
                f"{row['trained_fraction']:.3f} | {row['phi']:.2f} | {in_run} | {row['ideal_ratio']:.2f} | "
                f"{row['measured_over_ideal']:.2f} |"
            )
        lines += ["", "| run | loop s | data s | selection forward s | selection overhead s | rest (training) s |"]
        lines += ["|---|---|---|---|---|---|"]
        for name, row in train.items():
            b = row["breakdown_seconds"]
            if b:
                lines.append(
                    f"| {name} | {row['loop_seconds']:.2f} | {b['data_seconds']:.2f} | "
                    f"{b['selection_forward_seconds']:.2f} | {b['selection_overhead_seconds']:.2f} | "
                    f"{b['training_seconds']:.2f} |"
                )
    return "\n".join(lines)


def main(argv=None) -> None:
    (args,) = HfArgumentParser(BenchArguments).parse_args_into_dataclasses(argv)
    torch.set_num_threads(args.threads)
    load = [os.getloadavg()]
    micro = micro_benchmark(args)
    load.append(os.getloadavg())
    train = None if args.skip_training else throughput(args, micro)
    load.append(os.getloadavg())
    report = markdown(args, micro, train)
    report += "\n\nload average (1, 5, 15 min) at start / after part 1 / at end: " + " / ".join(
        ", ".join(f"{x:.1f}" for x in triple) for triple in load
    )
    print(report)
    os.makedirs(args.output_dir, exist_ok=True)
    result = {
        "arguments": asdict(args),
        "provenance": provenance(),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "load_average": load,
        },
        "micro": micro,
        "throughput": train,
    }
    with open(os.path.join(args.output_dir, "results.json"), "w") as handle:
        json.dump(result, handle, indent=2)
    with open(os.path.join(args.output_dir, "results.md"), "w") as handle:
        handle.write(report + "\n")


if __name__ == "__main__":
    main()
