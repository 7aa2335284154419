"""What `benchmarks/benchmark.py` runs: every strategy of one protocol, then the report."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .logs import CLOCKS, load_logs
from .report import epochs_for_budget, epochs_for_relative_budget, write_report
from .settings import RunSettings
from .strategies import DEFAULT_STRATEGIES, Strategy, build_strategy

if TYPE_CHECKING:
    from .workloads import Workload

logger = logging.getLogger(__name__)


@dataclass
class BenchmarkArguments(RunSettings):
    """The flags of benchmarks/benchmark.py and benchmarks/benchmark_text.py: the run settings every strategy shares
    (`RunSettings`), which strategies run, and how their epochs are chosen."""

    strategies: str = field(
        default=",".join(DEFAULT_STRATEGIES),
        metadata={
            "help": "Comma-separated: traditional, sb, stale-sb, sb-warmup, kath18, composer, composer-card, "
            "uniform, uniform-for-<strategy> (the random-subset control of that strategy: uniform at the backward "
            "fraction it realised in this --output_dir, read from <strategy>.json when the control starts, so list "
            "it after the strategy; at --keep when there is no such log or with --interleave), topk, sb-weighted, "
            "infobatch, rholoss, rholoss-cdf, stale-rholoss, sb-anneal, sb-anneal-floor, sb-anneal-weighted, "
            "stale-sb-anneal; any of them followed by knobs that set one flag each: -keep<fraction> (sb_keep, e.g. "
            "sb-keep0.5), -n<staleness> (sb_staleness: stale-sb-n2-keep0.5), -r<ratio> and -delta<share> "
            "(InfoBatch's prune ratio and annealing: infobatch-r0.3-delta0.75), -end<share> (sb_end of an annealed "
            "strategy)."
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
    threads: int = field(
        default=1,
        metadata={"help": "torch.set_num_threads (1: on a shared 2-core machine 2 threads spin-wait and crawl)."},
    )
    title: str | None = field(default=None, metadata={"help": "Report title (default: from the logs)."})
    interleave: bool = field(
        default=False,
        metadata={
            "help": "Train the strategies in turns of one epoch (A B C A B C ...) so that a changing load on "
            "a shared machine hits all of them alike. Default: one after another, each JSON written as it ends "
            "(restartable, and what the scripts in benchmarks/ use on an idle machine)."
        },
    )
    report_only: bool = field(
        default=False, metadata={"help": "Only rebuild report.md and the PNGs from the JSON logs."}
    )

    def __post_init__(self):
        super().__post_init__()
        if self.protocol == "budget" and self.paper_dir is None and not self.report_only:
            raise ValueError("--protocol budget needs --paper_dir (the paper-protocol logs that give epoch costs)")
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"--keep must be in (0, 1], got {self.keep}")

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


def matched_control(strategy: Strategy, output_dir: str) -> Strategy:
    """``uniform-for-<name>`` at the backward fraction (backward passes per example read) that ``<name>`` realised
    in ``output_dir``, once its log is there; any other strategy as it is."""
    controlled = strategy.name.removeprefix("uniform-for-")
    path = os.path.join(output_dir, f"{controlled}.json")
    if controlled == strategy.name or not os.path.isfile(path):
        return strategy
    with open(path) as handle:
        stats = json.load(handle)["stats"]
    fraction = stats["backwards"] / stats["examples_seen"]
    label = f"Uniform, keep {fraction:.2f} (control of {controlled})"
    return Strategy(strategy.name, label, {**strategy.overrides, "sb_keep": fraction})


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


def _run_length(epochs: float, budget: float | None) -> str:
    """The progress bar's account of a run's length: with a budget the trainer sizes the epochs itself, so the
    configured ones are only the full run the budget is a share of."""
    if budget is None:
        return f"{epochs:g} epochs"
    return f"budget {budget:g} of a {epochs:g}-epoch run"


def main(args: BenchmarkArguments, load_workload: Callable[[int], Workload]) -> str:
    """Run what is missing in ``args.output_dir`` and write the report; ``load_workload(seed)`` gives the data."""
    title = args.title  # None: from the logs (dataset, protocol, epochs or budget)
    if args.report_only:
        return write_report(args.output_dir, title)

    import torch
    from tqdm.auto import tqdm

    from .runner import run_interleaved, run_strategy, write_log

    torch.set_num_threads(args.threads)
    strategies = args.strategy_list()
    if args.protocol == "budget":
        strategies = paper_strategies(args.paper_dir, strategies)
    plan = plan_epochs(args, strategies)
    todo = [s for s in strategies if not os.path.exists(os.path.join(args.output_dir, f"{s.name}.json"))]
    for s in strategies:
        if s not in todo:
            logger.warning("%s: %s.json exists, skipped (delete it to re-run)", s.name, s.name)
    settings = args.run_settings()
    if todo:
        workload = load_workload(args.seed)
        progress = tqdm(total=len(todo), desc="strategies", unit="run")

        def done(strategy: Strategy, log: dict) -> None:
            write_log(log, os.path.join(args.output_dir, f"{strategy.name}.json"))
            last = log["evals"][-1]
            progress.update()
            tqdm.write(
                f"{strategy.name}: {log['epochs_trained']:g} epochs read, test error {100 * last['error']:.2f} %, "
                f"{log['train_wall_seconds']:.0f} s wall / {log['train_cpu_seconds']:.0f} s CPU training"
            )
            write_report(args.output_dir, title)

        jobs = [(s, *plan[s.name]) for s in todo]
        if args.interleave:
            run_interleaved(jobs, workload, settings, done)
        else:
            for strategy, epochs, extra in jobs:
                strategy = matched_control(strategy, args.output_dir)
                progress.set_postfix_str(f"{strategy.name} ({_run_length(epochs, args.sb_budget)})")
                try:
                    log = run_strategy(strategy, workload, settings, epochs, extra)
                except Exception:  # one broken strategy should not cost the others their runs
                    logger.exception("%s failed; going on with the next strategy", strategy.name)
                    continue
                done(strategy, log)
        progress.close()
    return write_report(args.output_dir, title)
