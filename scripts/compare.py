"""Strategies side by side: one run each, with the same seed, model, data and schedule, then one table.

    python scripts/compare.py                      # scikit-learn's digits, which ship with it: no download
    python scripts/compare.py --strategies none,sb,sb:sb_staleness=3,uniform:0.33 --num_train_epochs 3
    python scripts/compare.py --dataset uoft-cs/cifar10 --max_train_samples 5000 --output_dir outputs/cifar10
    python scripts/compare.py --workflow text --dataset path/to/sst2 --strategies none,infobatch,uniform:0.65
    make demo                                      # all-MiniLM-L6-v2 fine-tuned on SST-2 (the Makefile's flags)

Each run is what scripts/train.py (images) or scripts/train_text.py (--workflow text) would train with the same
flags plus the strategy's, into <output_dir>/<run>/; a line is printed as each run ends, the table at the end
(also written to <output_dir>/compare.md), and the Trainer's own output goes to <output_dir>/train.log.
--output_dir is claimed as scripts/train.py claims its own: a folder that holds anything is refused unless
--overwrite_output_dir. Flags: --help.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import sys
import warnings
from collections.abc import Callable
from contextlib import ExitStack, contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field, fields

import torch
from transformers import HfArgumentParser
from transformers.trainer import TRAINER_STATE_NAME
from transformers.utils import logging as transformers_logging

# Importing the workflows imports timm, whose older releases warn about their own use of torch (a deprecation
# notice): like the Trainer's output, such notices go to train.log, written once the output folder is known.
with warnings.catch_warnings(record=True) as IMPORT_WARNINGS:
    warnings.simplefilter("default")
    from hf_selective_backprop import SelectiveBackpropConfig
    from hf_selective_backprop.cli import group_flags
    from hf_selective_backprop.config import SelectiveBackpropArguments
    from hf_selective_backprop.data import DataArguments
    from hf_selective_backprop.engine.accounting import STATS_FILE
    from hf_selective_backprop.models import ModelArguments
    from hf_selective_backprop.output_lock import claimed
    from hf_selective_backprop.workflow import (
        TEXT_TRAINING_DEFAULTS,
        OutputArguments,
        check_output_dir,
        check_output_dir_is_free,
        train_image_classifier,
    )

PROG, LOG_FILE, TABLE_FILE = "compare.py", "train.log", "compare.md"
#: What runs without --strategies: the plain run, InfoBatch (the default strategy) and a random subset of about its
#: size on digits (InfoBatch trained 0.65 of the examples there), the control.
DEFAULT_STRATEGIES = "none,infobatch,uniform:0.65"
#: The flags a --strategies entry may set: the strategy's own (every sb_* flag but the strategy).
STRATEGY_FLAGS = tuple(f.name for f in fields(SelectiveBackpropArguments) if f.name != "sb_strategy")

# The schedule on digits (9 epochs of SGD, cosine decay); every one is a flag.
IMAGE_DEFAULTS = dict(
    dataset="digits",
    num_train_epochs=9,
    per_device_train_batch_size=32,
    per_device_eval_batch_size=256,
    learning_rate=0.05,
    lr_scheduler_type="cosine",
    weight_decay=5e-4,
    optim="sgd",
    optim_args="momentum=0.9",
)
# Every run: one seed, one evaluation after training, nothing saved or logged between (the table is the output).
EVERY_RUN = dict(
    output_dir="outputs/compare",
    seed=0,
    eval_strategy="no",
    save_strategy="no",
    logging_strategy="no",
    report_to="none",
    disable_tqdm=True,
)


@dataclass
class CompareArguments:
    strategies: str = field(
        default=DEFAULT_STRATEGIES,
        metadata={
            "help": "Comma-separated runs, each an --sb_strategy (none, sb, infobatch, uniform, composer, ...) "
            "optionally followed by its kept fraction and its own sb_* flags, each after a colon: 'uniform:0.65' "
            "(--sb_keep 0.65), 'sb:sb_staleness=3', 'composer:0.5:sb_start=0.5:sb_end=0.9:sb_interrupt=2'. Every "
            "other flag (--sb_keep, --num_train_epochs, ...) applies to every run; the first run is the one the "
            "others' savings are measured against."
        },
    )
    workflow: str = field(
        default="image",
        metadata={
            "help": "Which script's flags and training each run takes: 'image' (scripts/train.py) or 'text' "
            "(scripts/train_text.py; `--workflow text --help` lists its flags).",
            "choices": ["image", "text"],
        },
    )
    threads: int = field(
        default=1,
        metadata={"help": "torch intra-op threads (1 keeps timings steady on a shared machine; more on an idle one)."},
    )


@dataclass(frozen=True)
class Workflow:
    """The script a run is trained as: its argument dataclasses (the script's own first, SelectiveBackpropConfig
    last), their defaults here, how one run is trained, and how the table's header names the data and model."""

    script: str
    arguments: tuple
    defaults: dict
    train: Callable
    describe: Callable


def image_workflow() -> Workflow:
    def train(model_args, data_args, output_args, config):
        train_image_classifier(config, data_args, model_args, output_args.overwrite_output_dir)

    return Workflow(
        "scripts/train.py", (ModelArguments, DataArguments, OutputArguments, SelectiveBackpropConfig),
        {**IMAGE_DEFAULTS, **EVERY_RUN}, train, lambda model_args, data_args: f"{data_args.dataset}, {model_args.name}",
    )


def text_workflow() -> Workflow:
    # scripts/train_text.py, beside this script (Python puts a script's folder first on its path).
    import train_text

    from hf_selective_backprop.data.text import TextDataArguments
    from hf_selective_backprop.text_models import TextModelArguments

    def train(model_args, data_args, output_args, config):
        train_text.train(config, data_args, model_args, output_args.overwrite_output_dir)

    def describe(model_args, data_args):
        model = model_args.model_name_or_path or f"a {model_args.num_layers}-layer BERT from scratch"
        return f"{data_args.dataset} ({data_args.task}), {model}"

    return Workflow(
        "scripts/train_text.py", (TextModelArguments, TextDataArguments, OutputArguments, SelectiveBackpropConfig),
        {**TEXT_TRAINING_DEFAULTS, **EVERY_RUN}, train, describe,
    )


WORKFLOWS = {"image": image_workflow, "text": text_workflow}


class Parser(HfArgumentParser):
    """Errors as one line naming the flag (or the --strategies entry, `context`), without the usage: the
    Trainer's flags would make it hundreds of lines long."""

    context = ""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {self.context}{message}\n")

    def parse(self, argv: list[str], context: str = "") -> list:
        self.context = context
        try:
            return self.parse_args_into_dataclasses(argv)
        except ValueError as error:  # a dataclass's own check (--sb_keep 0, ...)
            self.error(str(error))


@dataclass(frozen=True)
class Run:
    label: str  # the --strategies entry
    folder: str  # where it trains: a sub-folder of --output_dir
    flags: tuple[str, ...]  # the strategy's flags


def parse_strategies(text: str, output_dir: str) -> list[Run]:
    """The runs --strategies names, each with the flags its entry sets; ValueError for an entry that is not one."""
    runs = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            raise ValueError(
                f"--strategies {text!r} names an empty run: give comma-separated strategies such as "
                f"{DEFAULT_STRATEGIES}"
            )
        strategy, *settings = (part.strip() for part in entry.split(":"))
        if not strategy:
            raise ValueError(f"--strategies entry {entry!r} names no --sb_strategy before its settings")
        flags, name = {}, [strategy]
        for setting in settings:
            flag, given, value = setting.partition("=")
            flag, value = (flag.strip().removeprefix("--"), value.strip()) if given else ("sb_keep", setting)
            if flag not in STRATEGY_FLAGS:
                raise ValueError(
                    f"--strategies entry {entry!r}: {setting!r} is neither a kept fraction nor an sb_* flag of the "
                    "trainer with its value (sb_staleness=3, sb_prune_ratio=0.3, ...)"
                )
            if flag in flags or not value:
                problem = "set twice" if value else "given no value"
                raise ValueError(f"--strategies entry {entry!r}: {flag} is {problem}")
            flags[flag] = value
            name.append(flag.removeprefix("sb_") + value)
        folder = re.sub(r"[^\w.+-]", "_", "-".join(name))
        if any(run.folder == os.path.join(output_dir, folder) for run in runs):
            raise ValueError(
                f"--strategies names the run {entry!r} twice: each run trains into a folder of its own "
                f"({os.path.join(output_dir, folder)}); give each once"
            )
        words = ["--sb_strategy", strategy]
        for flag, value in flags.items():
            words += [f"--{flag}", value]
        runs.append(Run(entry, os.path.join(output_dir, folder), tuple(words)))
    return runs


def refuse_links(output_dir: str, runs: list[Run]) -> None:
    """Refuse a symbolic link where this script writes (its log, its table, a run's folder): an
    --overwrite_output_dir folder may hold one, and writing through it would reach a file outside the folder."""
    for path in (os.path.join(output_dir, LOG_FILE), os.path.join(output_dir, TABLE_FILE), *(r.folder for r in runs)):
        if os.path.islink(path):
            raise ValueError(
                f"--output_dir {output_dir!r}: {path} is a symbolic link, which this script would write through: "
                "delete it, or choose another --output_dir"
            )
        if path.endswith((LOG_FILE, TABLE_FILE)) and os.path.lexists(path) and not os.path.isfile(path):
            raise ValueError(f"--output_dir {output_dir!r}: {path} is not a file, and this script writes one there")


def open_for_writing(path: str):
    """``path`` replaced by a new text file, never through a symbolic link."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    return os.fdopen(descriptor, "w")


def outcome(folder: str) -> tuple[str, float | None, dict]:
    """A finished run's final evaluation (its name and value; None without one) and its costs (sb_stats.json)."""
    with open(os.path.join(folder, STATS_FILE)) as handle:
        stats = json.load(handle)
    with open(os.path.join(folder, TRAINER_STATE_NAME)) as handle:
        history = json.load(handle)["log_history"]
    for metric in ("eval_accuracy", "eval_loss"):
        values = [entry[metric] for entry in history if metric in entry]
        if values:
            return metric.removeprefix("eval_").replace("_", " "), values[-1], stats
    return "accuracy", None, stats


def run_line(index: int, total: int, run: Run, result: tuple[str, float | None, dict]) -> str:
    metric, value, stats = result
    shown = "n/a" if value is None else f"{value:.4f}"
    return (
        f"[{index}/{total}] {run.label}: {metric} {shown}, {stats['backwards']:,} backward passes, "
        f"{stats['selection_forwards']:,} selection forwards, {stats['train_seconds']:.1f} s -> {run.folder}"
    )


def table(header: str, runs: list[Run], results: list, split: str | None) -> str:
    metric = results[0][0]
    first = runs[0].label
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    lines = [
        header,
        f"{device}, {torch.get_num_threads()} torch thread(s), {platform.system()} {platform.machine()}, "
        f"torch {torch.__version__}",
        "",
        f"| run | {split or 'eval'} {metric} | backward passes | fewer backward passes | selection forwards | "
        f"train time (s) | saving vs {first} |",
        "|---|---|---|---|---|---|---|",
    ]
    base, base_backwards = results[0][2]["train_seconds"], results[0][2]["backwards"]
    for run, (_, value, stats) in zip(runs, results, strict=True):
        shown = "n/a" if value is None else f"{value:.4f}"
        fewer = f"{base_backwards / stats['backwards']:.2f}x" if stats["backwards"] else "n/a"
        lines.append(
            f"| {run.label} | {shown} | {stats['backwards']:,} | {fewer} | {stats['selection_forwards']:,} "
            f"| {stats['train_seconds']:.1f} | {base / stats['train_seconds']:.2f}x |"
        )
    lines += [
        "",
        f"fewer backward passes: how many times fewer examples were backpropagated than in {first}, the same on every "
        "machine; saving: how many times less training time (1.50x: two thirds of its time), which depends on the "
        "machine and on what else runs on it.",
    ]
    return "\n".join(lines)


@contextmanager
def logged_to(stream):
    """Within: transformers' log lines (a pretrained model's loading report among them) go to ``stream``. Its handler
    holds the stream it was made with, so redirecting sys.stderr alone would leave them on the terminal."""
    handlers = [handler for handler in logging.getLogger("transformers").handlers
                if isinstance(handler, logging.StreamHandler)]
    previous = [handler.setStream(stream) for handler in handlers]
    try:
        yield
    finally:
        for handler, old in zip(handlers, previous, strict=True):
            handler.setStream(old)


def fail(message: str) -> None:
    sys.exit(f"{PROG}: error: {message}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The workflow decides which flags exist: read it first (--help then lists that workflow's).
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--workflow", choices=sorted(WORKFLOWS), default="image")
    workflow = WORKFLOWS[early.parse_known_args(argv)[0].workflow]()
    parser = group_flags(Parser(
        (CompareArguments, *workflow.arguments), prog=PROG,
        usage=f"%(prog)s [--strategies RUNS] [--workflow {{image,text}}] [any flag of {workflow.script}]",
    ))
    parser.set_defaults(**workflow.defaults)
    if any(word.split("=")[0] in ("--sb_strategy", "--sb-strategy") for word in argv):
        fail("--sb_strategy: each run's strategy is an entry of --strategies (for example --strategies none,sb)")
    # The flags every run shares, checked once (as a plain run: an entry's own settings are checked with it).
    args, model_args, data_args, output_args, config = parser.parse([*argv, "--sb_strategy", "none"])
    if config.resume_from_checkpoint is not None:
        fail("--resume_from_checkpoint: this script starts every run afresh; resume one with scripts/train.py")
    if config.max_steps <= 0 and not config.num_train_epochs > 0:
        fail(f"--num_train_epochs must be > 0 (or set --max_steps), got {config.num_train_epochs:g}: the runs "
             "would train nothing and compare untrained models")
    output_dir = config.output_dir
    try:
        runs = parse_strategies(args.strategies, output_dir)
        # Every run's flags before any data is read or anything written (--strategies sb:sb_keep=0 fails here).
        settings = [parser.parse([*argv, *run.flags, "--output_dir", run.folder], f"--strategies entry "
                                 f"{run.label!r}: ")[1:] for run in runs]
        check_output_dir(output_dir)
        check_output_dir_is_free(output_dir, overwrite=output_args.overwrite_output_dir)
        refuse_links(output_dir, runs)
    except ValueError as error:
        fail(str(error))
    torch.set_num_threads(args.threads)
    log_path = os.path.join(output_dir, LOG_FILE)
    results = []
    with ExitStack() as stack:
        try:
            stack.enter_context(claimed(output_dir))  # refused while another run holds it
        except ValueError as error:
            fail(str(error))
        print(f"Training {', '.join(run.label for run in runs)} on {data_args.dataset}; the Trainer's output goes "
              f"to {log_path}", flush=True)
        terminal = sys.stdout
        # The table is the output: the Trainer's log lines and the warnings raised while training (a library's
        # deprecation notice, such as an older timm's on import) go to the log file, its progress bars nowhere. An
        # error still reaches the terminal: its traceback is printed after the block restores stderr.
        transformers_logging.disable_progress_bar()
        log = stack.enter_context(open_for_writing(log_path))
        with redirect_stdout(log), redirect_stderr(log), logged_to(log):
            for caught in IMPORT_WARNINGS:
                warnings.showwarning(caught.message, caught.category, caught.filename, caught.lineno)
            for index, (run, run_args) in enumerate(zip(runs, settings, strict=True), 1):
                workflow.train(*run_args)
                results.append(outcome(run.folder))
                print(run_line(index, len(runs), run, results[-1]), file=terminal, flush=True)
        header = f"{workflow.describe(model_args, data_args)}, {config.num_train_epochs:g} epochs, seed {config.seed}"
        summary = table(header, runs, results, data_args.eval_split)
        with open_for_writing(os.path.join(output_dir, TABLE_FILE)) as handle:
            handle.write(summary + "\n")
    print("\n" + summary)


if __name__ == "__main__":
    main()
