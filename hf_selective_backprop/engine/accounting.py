"""Counters and timers of a selection run: what the paper's Figure 1 breaks down."""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields

from transformers.trainer_utils import has_length

from . import distributed
from .budget import PHI_MEASURING, PHI_NOT_MEASURED

#: The run's summary, written into output_dir when training ends.
STATS_FILE = "sb_stats.json"

COUNTERS = (
    "examples_seen",
    "examples_loaded",
    "selection_forwards",
    "stale_lookups",
    "considered",
    "kept",
    "training_forwards",
    "backwards",
    "optimizer_steps",
    "nonfinite_losses",
    "reference_forwards",
    "lockstep_forwards",
)
TIMERS = (
    "data_seconds",
    "selection_forward_seconds",
    "selection_overhead_seconds",
    "eval_seconds",
    "save_seconds",
    "reference_seconds",
)
#: Summary figures that are wall-clock times (or shares of them): they differ from run to run.
WALL_CLOCK_FIGURES = (*TIMERS, "train_seconds", "training_seconds", "selection_overhead_share")

logger = logging.getLogger(__name__)


@dataclass
class SelectionStats:
    """Counts are in examples (optimizer_steps in steps); times in seconds, per process.

    ``examples_seen`` counts every example an epoch passed, ``examples_loaded`` those the data
    loader actually produced (fewer when a strategy decides before loading).
    ``considered``/``kept`` cover examples that went through a selector; rows trained
    without selection (warm-up, interrupts, outside sb_start/sb_end) count in
    ``examples_seen`` and ``training_forwards`` only.
    """

    examples_seen: int = 0
    examples_loaded: int = 0
    selection_forwards: int = 0
    stale_lookups: int = 0
    considered: int = 0
    kept: int = 0
    training_forwards: int = 0
    backwards: int = 0
    optimizer_steps: int = 0
    nonfinite_losses: int = 0
    reference_forwards: int = 0
    #: One-row forwards whose losses are thrown away, run by a rank with nothing to score while another rank
    #: scores: a sharded model (ZeRO-3, FSDP) gathers its weights in every forward, on every rank together.
    lockstep_forwards: int = 0
    data_seconds: float = 0.0
    selection_forward_seconds: float = 0.0
    selection_overhead_seconds: float = 0.0
    eval_seconds: float = 0.0
    save_seconds: float = 0.0
    reference_seconds: float = 0.0

    #: Called at each timer's start and end when set (--sb_sync_timers on an accelerator): kernels run
    #: asynchronously, so without it a phase's time is that of launching its work, not of doing it.
    #: Not a field: it is no counter and stays out of ``state_dict``.
    synchronize = None

    @contextmanager
    def timer(self, name: str):
        if self.synchronize is not None:
            self.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.synchronize is not None:
                self.synchronize()
            setattr(self, name, getattr(self, name) + time.perf_counter() - start)

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for f in fields(self):
            if f.name in state:
                setattr(self, f.name, type(f.default)(state[f.name]))


def merged_stats(states: list[dict]) -> dict:
    """Counters of several saved ranks taken over by one: summed; a step is taken by all ranks together, and
    times are per process (the longest kept)."""
    merged = {name: sum(state.get(name, 0) for state in states) for name in COUNTERS}
    merged["optimizer_steps"] = max(state.get("optimizer_steps", 0) for state in states)
    for name in TIMERS:
        merged[name] = max(state.get(name, 0.0) for state in states)
    return merged


def summarize(totals: dict, wall_seconds: float) -> dict:
    """Derived figures from counters summed over processes (times: max over processes)."""
    summary = dict(totals)
    summary["kept_fraction"] = totals["kept"] / totals["considered"] if totals["considered"] else 1.0
    seen = totals["examples_seen"]
    summary["backward_fraction"] = totals["backwards"] / seen if seen else 0.0
    summary["train_seconds"] = wall_seconds
    selection = totals["selection_forward_seconds"] + totals["selection_overhead_seconds"]
    elsewhere = totals["data_seconds"] + totals["eval_seconds"] + totals["save_seconds"] + totals["reference_seconds"]
    summary["training_seconds"] = max(wall_seconds - selection - elsewhere, 0.0)
    summary["selection_overhead_share"] = (
        totals["selection_overhead_seconds"] / summary["training_seconds"] if summary["training_seconds"] else 0.0
    )
    return summary


def run_summary(accelerator, stats: SelectionStats, start: float | None) -> dict:
    """Counters summed over processes plus derived figures (a collective: call on every rank).

    ``optimizer_steps`` is not summed: every rank takes each step together (the same number
    on each), so examples backpropagated = optimizer_steps x batch x accumulation x processes.
    """
    state = stats.state_dict()
    totals = distributed.sum_over_processes(accelerator, {k: state[k] for k in COUNTERS})
    totals = {k: int(v) for k, v in totals.items()}
    totals["optimizer_steps"] = int(state["optimizer_steps"])
    totals.update({k: state[k] for k in TIMERS})
    now = time.perf_counter()
    return summarize(totals, now - (start if start is not None else now))


def write_stats(summary: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as handle:
        json.dump(summary, handle, indent=2, sort_keys=True)


def full_pass_summary(global_step: int, epochs: float, num_examples: int, train_seconds: float) -> dict:
    """The counters of a run without selection (``sb_strategy="none"``): every example read is trained."""
    rows = round(epochs * num_examples)
    return {
        "strategy": "none",
        "examples_seen": rows,
        "examples_loaded": rows,
        "selection_forwards": 0,
        "training_forwards": rows,
        "backwards": rows,
        "optimizer_steps": global_step,
        "kept_fraction": 1.0,
        "queued_at_end": 0,
        "train_seconds": train_seconds,
    }


#: A realised kept fraction below this share of the expected one is explained in the log at the end of a run.
KEPT_FRACTION_DRIFT = 0.75


def end_of_run_notes(
    summary: dict, expected_keep: float | None, history_size: int, rows_per_step: int | None = None
) -> list[tuple[int, str]]:
    """What the end-of-run counters show that a user would otherwise have to work out, each with its logging level:
    kept rows the run ended before training, and a kept fraction well below the strategy's expected one.
    ``rows_per_step``: the rows one optimizer step trains, over all processes.

    Rows left queued that are fewer than one step takes are how every selective run ends (steps are whole
    batches): bookkeeping, at INFO. Whole steps' worth left, or a kept fraction far from the expected one, change
    what the run trained from what its settings say: a WARNING."""
    notes = []
    queued = summary.get("queued_at_end", 0)
    if queued:
        level = logging.INFO
        if rows_per_step is None or queued < rows_per_step:
            size = f" ({rows_per_step} rows)" if rows_per_step else ""
            why = f"fewer than one optimizer step takes{size}"
        else:
            # A run that ends by steps stops with whole steps' worth queued (a large --sb_selection_batch_size).
            level = logging.WARNING
            why = (f"{queued / rows_per_step:.1f} optimizer steps' worth ({rows_per_step} rows a step) that the "
                   "run ended before taking")
        notes.append((level, (
            f"{queued} rows that selection kept were still queued when the run ended, {why}: they were not trained "
            "('kept' counts them, 'backwards' does not; sb_stats.json 'queued_at_end')"
        )))
    kept = summary.get("kept_fraction")
    if expected_keep is not None and summary.get("considered") and kept < KEPT_FRACTION_DRIFT * expected_keep:
        notes.append((logging.WARNING, (
            f"selection kept {kept:.3f} of the examples it considered, well below the expected {expected_keep:.3f}: "
            f"each loss is ranked against the last {history_size} losses (--sb_history_size), and while losses fall, "
            "as they do early and on short runs, that history holds older, higher losses, so fresh ones rank low "
            "and are kept less often"
        )))
    return notes


def plain_run_summary(trainer, train_seconds: float | None = None) -> dict:
    """`full_pass_summary` of ``trainer``'s run without selection so far, from the Trainer's own state (so a resumed
    run counts what the uninterrupted one did); with --sb_budget, the share of the full run's cost spent."""
    state, args = trainer.state, trainer.args
    if has_length(trainer.train_dataset):
        examples, epochs = len(trainer.train_dataset), state.epoch or 0.0
    else:  # a stream: every step trains full batches on every process
        examples, epochs = args.train_batch_size * args.gradient_accumulation_steps * args.world_size, state.global_step
    summary = full_pass_summary(state.global_step, epochs, examples, train_seconds)
    if trainer.plain_budget is not None:
        summary["budget_spent"] = trainer.plain_budget.spent(state.global_step)
    return summary


def logged_counters(trainer) -> dict:
    """The ``sb/*`` entries of ``trainer``'s training logs: a selective run's counters summed over processes (a
    collective), or a plain run's full-pass counters (and, with a budget, the share of the full run's cost spent).
    Counters only: wall-clock figures differ between a resumed and an uninterrupted run, so they are in train()'s
    metrics and sb_stats.json, not in the log history."""
    if trainer.selector is None:
        summary = plain_run_summary(trainer)
    else:
        summary = trainer.selection_summary()
    return {f"sb/{k}": v for k, v in summary.items() if k not in (*WALL_CLOCK_FIGURES, "strategy")}


def finish_plain_run(trainer, metrics: dict, folder: str) -> dict:
    """A run without selection's summary, as `finish_run` gives a selective one's: in train()'s ``metrics`` and
    sb_stats.json in ``folder`` (the run's: a hyperparameter search trial's own)."""
    stats = plain_run_summary(trainer, metrics.get("train_runtime"))
    metrics.update({f"sb/{k}": v for k, v in stats.items()})
    if trainer.args.should_save:
        os.makedirs(folder, exist_ok=True)
        write_stats(stats, os.path.join(folder, STATS_FILE))
    return stats


def finish_run(trainer, metrics: dict, expected_steps: int, folder: str) -> dict:
    """The run's summary (a collective), added to train()'s ``metrics`` and written to sb_stats.json in ``folder``;
    the notes on it (`end_of_run_notes`) are logged, each at its level, by the process that logs."""
    args = trainer.args
    stats = {**trainer.selection_summary(), "strategy": args.sb_strategy, "expected_steps": expected_steps}
    if stats.get("cost_phi_source") == PHI_MEASURING:  # it ended first: its cost is priced at the cost model's phi
        stats["cost_phi_source"] = PHI_NOT_MEASURED
    queued = distributed.sum_over_processes(trainer.accelerator, {"rows": len(trainer.engine.queue)})["rows"]
    stats["queued_at_end"] = int(queued)
    rows_per_step = trainer.engine.batch_size * args.gradient_accumulation_steps * trainer.accelerator.num_processes
    notes = end_of_run_notes(stats, trainer.selector.expected_keep_fraction(), args.sb_history_size, rows_per_step)
    metrics.update({f"sb/{k}": v for k, v in stats.items()})
    if args.should_save:
        os.makedirs(folder, exist_ok=True)
        write_stats(stats, os.path.join(folder, STATS_FILE))
    if args.should_log:
        for level, note in notes:
            logger.log(level, note)
    return stats
