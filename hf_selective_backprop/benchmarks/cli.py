"""What `scripts/benchmark.py` runs: every strategy of one protocol, then the report."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .logs import CLOCKS, load_logs
from .report import epochs_for_budget, epochs_for_relative_budget, write_report
from .strategies import DEFAULT_STRATEGIES, Strategy, build_strategy

if TYPE_CHECKING:
    from .workloads import Workload

logger = logging.getLogger(__name__)


@dataclass
class BenchmarkArguments:
    output_dir: str = field(metadata={"help": "Where <strategy>.json logs, report.md and the PNGs go."})
    strategies: str = field(
        default=",".join(DEFAULT_STRATEGIES),
        metadata={
            "help": "Comma-separated: traditional, sb, stale-sb, sb-warmup, kath18, composer, composer-card, "
            "uniform, uniform-for-<strategy> (uniform at --keep, named as the control of that strategy), topk, "
            "infobatch, infobatch-r<ratio>, rholoss, rholoss-cdf, stale-rholoss, sb-anneal, sb-anneal-floor, "
            "sb-anneal-weighted, stale-sb-anneal."
        },
    )
    protocol: str = field(
        default="paper",
        metadata={
            "help": "'paper': every strategy runs --num_train_epochs epochs (same epoch-based LR schedule). "
            "'budget': every strategy gets the same training-time budget; its epochs (and so its LR "
            "schedule) are sized from its per-epoch cost in the paper-protocol logs of --paper_dir.",
            "choices": ["paper", "budget"],
        },
    )
    num_train_epochs: float = field(default=10.0, metadata={"help": "Epochs of every run (paper protocol)."})
    keep: float = field(default=1.0 / 3.0, metadata={"help": "Kept fraction of every selection strategy (sb_keep)."})
    staleness: int = field(default=3, metadata={"help": "n of stale-sb and stale-rholoss."})
    reference_model: str | None = field(
        default=None,
        metadata={
            "help": "rholoss / rholoss-cdf / stale-rholoss: folder of the reference model (scripts/train.py "
            "--train_on holdout). Its training time (train_results.json) and its pass over the data count in the "
            "strategy's time."
        },
    )
    warmup_epochs: int | None = field(
        default=None, metadata={"help": "Full-data epochs of sb-warmup (default: half of --num_train_epochs)."}
    )
    paper_dir: str | None = field(
        default=None, metadata={"help": "Budget protocol: folder of the paper-protocol logs giving epoch costs."}
    )
    budget_seconds: float | None = field(
        default=None,
        metadata={
            "help": "Budget protocol: training seconds per strategy (default: Traditional's total in --paper_dir)."
        },
    )
    budget_clock: str = field(
        default="cpu",
        metadata={
            "help": "Clock of the budget and epoch costs: cpu (default: with one thread, the process's CPU time "
            "is what another user's load inflates least) or wall.",
            "choices": list(CLOCKS),
        },
    )
    seed: int = field(default=42, metadata={"help": "Seed of every run (model init, data order, selection)."})
    batch_size: int = field(default=128, metadata={"help": "Training batch size."})
    eval_batch_size: int = field(default=256, metadata={"help": "Evaluation batch size."})
    learning_rate: float = field(default=0.1, metadata={"help": "Peak SGD learning rate."})
    momentum: float = field(default=0.9, metadata={"help": "SGD momentum."})
    weight_decay: float = field(default=5e-4, metadata={"help": "Weight decay."})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "LR schedule over each run's epochs."})
    lr_decay_milestones: list[float] | None = field(
        default=None,
        metadata={
            "help": "Step decay on top of --lr_scheduler_type at these shares of each run (the paper's CIFAR-10 "
            "schedule: --lr_scheduler_type constant --lr_decay_milestones 0.3 0.6 0.8 --lr_decay_factor 0.2)."
        },
    )
    lr_decay_factor: float = field(default=0.2, metadata={"help": "Factor of each --lr_decay_milestones decay."})
    train_eval_samples: int = field(
        default=0,
        metadata={
            "help": "Also log, at every evaluation, the accuracy and the share of losses below 0.1 on the first N "
            "training images without augmentation (convergence evidence). 0: off."
        },
    )
    optim: str = field(
        default="sgd", metadata={"help": "Optimizer (a TrainingArguments --optim value; sgd uses --momentum)."}
    )
    warmup_steps: float = field(
        default=0.0, metadata={"help": "LR warm-up: steps, or a fraction of the run's steps when below 1."}
    )
    evals_per_epoch: float = field(
        default=1.0,
        metadata={
            "help": "Evaluations per epoch of data read: above 1, more points on the error-vs-time curve of short "
            "runs; below 1, fewer on long ones (0.5: every 2nd epoch); 0: one evaluation, after training (runs "
            "whose final error is all that is read)."
        },
    )
    threads: int = field(
        default=1,
        metadata={"help": "torch.set_num_threads (1: on a shared 2-core machine 2 threads spin-wait and crawl)."},
    )
    title: str | None = field(default=None, metadata={"help": "Report title (default: from the logs)."})
    interleave: bool = field(
        default=True,
        metadata={
            "help": "Train the strategies in turns of one epoch (A B C A B C ...) so that a changing load on "
            "a shared machine hits all of them alike; false: one after another (each JSON written as it ends)."
        },
    )
    report_only: bool = field(
        default=False, metadata={"help": "Only rebuild report.md and the PNGs from the JSON logs."}
    )

    def __post_init__(self):
        if self.protocol == "budget" and self.paper_dir is None and not self.report_only:
            raise ValueError("--protocol budget needs --paper_dir (the paper-protocol logs that give epoch costs)")
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"--keep must be in (0, 1], got {self.keep}")
        if self.train_eval_samples < 0:
            raise ValueError(f"--train_eval_samples must be >= 0, got {self.train_eval_samples}")
        if self.lr_decay_milestones is not None:
            from ..lr_schedule import check_milestones

            check_milestones(self.lr_decay_milestones, self.lr_decay_factor)
        if not 0 <= self.evals_per_epoch < float("inf"):
            raise ValueError(f"--evals_per_epoch must be >= 0, got {self.evals_per_epoch}")

    def strategy_list(self) -> list[Strategy]:
        warmup = self.warmup_epochs if self.warmup_epochs is not None else int(self.num_train_epochs // 2)
        names = [n.strip() for n in self.strategies.split(",") if n.strip()]
        return [build_strategy(n, self.keep, self.staleness, warmup, self.reference_model) for n in names]


def paper_strategies(paper_dir: str, strategies: list[Strategy]) -> list[Strategy]:
    """The budget protocol reruns each strategy with the settings of its paper-protocol log."""
    paper = load_logs(paper_dir)
    chosen = []
    for s in strategies:
        log = paper.get(s.name)
        if log is None:
            chosen.append(s)  # plan_epochs says what is missing
            continue
        if log["overrides"] != s.overrides:
            logger.warning("%s: using the paper run's settings %s, not %s", s.name, log["overrides"], s.overrides)
        chosen.append(Strategy(s.name, log.get("label", s.label), dict(log["overrides"])))
    return chosen


def plan_epochs(args: BenchmarkArguments, strategies: list[Strategy]) -> dict[str, tuple[float, dict]]:
    """Epochs per strategy, with what the log should record about how they were chosen."""
    if args.protocol == "paper":
        return {s.name: (args.num_train_epochs, {"protocol": "paper"}) for s in strategies}
    paper = load_logs(args.paper_dir)
    budget = args.budget_seconds
    relative = budget is None  # the budget is Traditional's paper run, costs relative to it per round
    if relative:
        if "traditional" not in paper:
            raise ValueError(f"no traditional.json in {args.paper_dir} to size the budget; pass --budget_seconds")
        budget = paper["traditional"][CLOCKS[args.budget_clock]]
    plan = {}
    for s in strategies:
        if s.name not in paper:
            raise ValueError(f"no {s.name}.json in {args.paper_dir}: run the paper protocol for it first")
        if relative:
            base = paper["traditional"]
            epochs = epochs_for_relative_budget(paper[s.name], base, base["epochs_trained"], args.budget_clock)
        else:
            epochs = epochs_for_budget(paper[s.name], budget, args.budget_clock)
        plan[s.name] = (
            round(epochs, 3),
            {
                "protocol": "budget",
                "budget_seconds": budget,
                "budget_clock": args.budget_clock,
                "budget_sizing": "traditional-epochs" if relative else "seconds",
                "paper_epochs": paper[s.name]["epochs_trained"],
                "paper_train_seconds": paper[s.name][CLOCKS[args.budget_clock]],
            },
        )
    return plan


def main(args: BenchmarkArguments, load_workload: Callable[[int], Workload]) -> str:
    """Run what is missing in ``args.output_dir`` and write the report; ``load_workload(seed)`` gives the data."""
    title = args.title  # None: from the logs (dataset, protocol, epochs or budget)
    if args.report_only:
        return write_report(args.output_dir, title)

    import torch
    from tqdm.auto import tqdm

    from .runner import RunSettings, run_interleaved, run_strategy, write_log

    torch.set_num_threads(args.threads)
    strategies = args.strategy_list()
    if args.protocol == "budget":
        strategies = paper_strategies(args.paper_dir, strategies)
    plan = plan_epochs(args, strategies)
    todo = [s for s in strategies if not os.path.exists(os.path.join(args.output_dir, f"{s.name}.json"))]
    for s in strategies:
        if s not in todo:
            logger.warning("%s: %s.json exists, skipped (delete it to re-run)", s.name, s.name)
    settings = RunSettings(
        output_dir=args.output_dir,
        num_train_epochs=args.num_train_epochs,
        seed=args.seed,
        batch_size=args.batch_size,
        eval_batch_size=args.eval_batch_size,
        learning_rate=args.learning_rate,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        lr_scheduler_type=args.lr_scheduler_type,
        optim=args.optim,
        warmup_steps=args.warmup_steps,
        evals_per_epoch=args.evals_per_epoch,
        lr_decay_milestones=tuple(args.lr_decay_milestones) if args.lr_decay_milestones else None,
        lr_decay_factor=args.lr_decay_factor,
        train_eval_samples=args.train_eval_samples,
    )
    if todo:
        workload = load_workload(args.seed)
        progress = tqdm(total=len(todo), desc="strategies", unit="run")

        def done(strategy: Strategy, log: dict) -> None:
            write_log(log, os.path.join(args.output_dir, f"{strategy.name}.json"))
            last = log["evals"][-1]
            progress.update()
            tqdm.write(
                f"{strategy.name}: {log['num_train_epochs']:g} epochs, test error {100 * last['error']:.2f} %, "
                f"{log['train_wall_seconds']:.0f} s wall / {log['train_cpu_seconds']:.0f} s CPU training"
            )
            write_report(args.output_dir, title)

        jobs = [(s, *plan[s.name]) for s in todo]
        if args.interleave:
            run_interleaved(jobs, workload, settings, done)
        else:
            for strategy, epochs, extra in jobs:
                progress.set_postfix_str(f"{strategy.name} ({epochs:g} epochs)")
                try:
                    log = run_strategy(strategy, workload, settings, epochs, extra)
                except Exception:  # one broken strategy should not cost the others their runs
                    logger.exception("%s failed; going on with the next strategy", strategy.name)
                    continue
                done(strategy, log)
        progress.close()
    return write_report(args.output_dir, title)
