"""The README's main job: Traditional vs Selective-Backprop vs Stale-SB, side by side, offline.

    python scripts/compare.py                      # scikit-learn's digits, ships with the package
    python scripts/compare.py --dataset uoft-cs/cifar10 --max_train_samples 5000

Trains each strategy with the same seed, model, data and schedule, then prints test accuracy,
backward passes, selection forwards and training wall time as one table; the Trainer's own
output goes to <output_dir>/train.log. Flags: --help.
"""

from __future__ import annotations

import os
import platform
import warnings
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field

import torch
from transformers import HfArgumentParser
from transformers.utils import logging as transformers_logging

# Importing the workflows imports timm, whose older releases warn about their own use of torch (a deprecation
# notice): like the Trainer's output, such notices go to train.log, written once the output folder is known.
with warnings.catch_warnings(record=True) as IMPORT_WARNINGS:
    warnings.simplefilter("default")
    from hf_selective_backprop import SelectiveBackpropConfig
    from hf_selective_backprop.data import DataArguments
    from hf_selective_backprop.models import ModelArguments
    from hf_selective_backprop.workflow import train_image_classifier

STRATEGIES = {
    "traditional": {"sb_strategy": "none"},
    "sb": {"sb_strategy": "sb"},
    "stale-sb": {"sb_strategy": "sb", "sb_staleness": 3},
    "uniform": {"sb_strategy": "uniform"},
}


@dataclass
class CompareArguments:
    output_dir: str = field(default="outputs/compare", metadata={"help": "One sub-folder per strategy."})
    strategies: str = field(
        default="traditional,sb,stale-sb,uniform",
        metadata={"help": f"Comma-separated, from {', '.join(STRATEGIES)}."},
    )
    keep: float = field(default=1 / 3, metadata={"help": "Kept fraction for every selective strategy."})
    epochs: float = field(default=9, metadata={"help": "Epochs (passes of the data through selection)."})
    batch_size: int = field(default=32, metadata={"help": "Training batch size."})
    learning_rate: float = field(default=0.05, metadata={"help": "Peak SGD learning rate (cosine decay)."})
    seed: int = field(default=0, metadata={"help": "Seed of every run."})
    threads: int = field(
        default=1,
        metadata={"help": "torch intra-op threads (1 keeps timings steady on a shared machine; more on an idle one)."},
    )


def config_for(args: CompareArguments, name: str) -> SelectiveBackpropConfig:
    return SelectiveBackpropConfig(
        output_dir=os.path.join(args.output_dir, name),
        sb_keep=args.keep if STRATEGIES[name]["sb_strategy"] != "none" else None,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=256,
        learning_rate=args.learning_rate,
        lr_scheduler_type="cosine",
        weight_decay=5e-4,
        optim="sgd",
        optim_args="momentum=0.9",
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        seed=args.seed,
        **STRATEGIES[name],
    )


def main() -> None:
    parser = HfArgumentParser((CompareArguments, DataArguments, ModelArguments))
    parser.set_defaults(dataset="digits")
    args, data_args, model_args = parser.parse_args_into_dataclasses()
    torch.set_num_threads(args.threads)
    names = [name.strip() for name in args.strategies.split(",") if name.strip()]
    unknown = sorted(set(names) - set(STRATEGIES))
    if unknown:
        parser.error(f"--strategies: unknown {unknown}; choose from {', '.join(STRATEGIES)}")
    os.makedirs(args.output_dir, exist_ok=True)
    log_path = os.path.join(args.output_dir, "train.log")
    print(f"Training {', '.join(names)} on {data_args.dataset}; the Trainer's output goes to {log_path}", flush=True)
    # The table is the output: the Trainer's log lines and the warnings raised while training (a library's
    # deprecation notice, such as an older timm's on import) go to the log file, its progress bars nowhere. An
    # error still reaches the terminal: its traceback is printed after the block restores stderr.
    transformers_logging.disable_progress_bar()
    with open(log_path, "w") as log, redirect_stdout(log), redirect_stderr(log):
        for caught in IMPORT_WARNINGS:
            warnings.showwarning(caught.message, caught.category, caught.filename, caught.lineno)
        # Each strategy's sub-folder belongs to this script: a rerun (make demo) replaces its results.
        results = [
            train_image_classifier(config_for(args, name), data_args, model_args, overwrite_output_dir=True)
            for name in names
        ]

    base = results[0].stats
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    machine = f"{platform.system()} {platform.machine()}, torch {torch.__version__}"
    lines = [
        f"{data_args.dataset}, {model_args.model}, {args.epochs:g} epochs, keep {args.keep:.2f}, seed {args.seed}",
        f"{device}, {args.threads} torch thread(s), {machine}",
        "",
        "| strategy | test accuracy | backward passes | selection forwards | train time (s) | time vs first |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in zip(names, results, strict=True):
        stats = result.stats
        lines.append(
            f"| {name} | {result.accuracy:.4f} | {stats['backwards']:,} | {stats['selection_forwards']:,} "
            f"| {stats['train_seconds']:.1f} | {stats['train_seconds'] / base['train_seconds']:.2f}x |"
        )
    table = "\n".join(lines)
    print("\n" + table)
    with open(os.path.join(args.output_dir, "compare.md"), "w") as handle:
        handle.write(table + "\n")


if __name__ == "__main__":
    main()
