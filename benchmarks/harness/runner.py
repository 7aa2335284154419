"""Train strategies and log test accuracy against training time after every epoch.

Training time excludes evaluation (and checkpointing, which benchmarks turn off). Two clocks
are kept because the benchmark machines are shared: wall time (`time.perf_counter`) and the
process's CPU time (`time.process_time`, all threads), which another user's load inflates
less. Evaluation happens after every epoch and its cost on both clocks is subtracted.

Interleaving (`run_interleaved`): on a shared machine the load changes over minutes, so runs
made one after another are timed under different conditions. Each strategy then trains in
its own thread and a `Turnstile` lets exactly one of them run at a time, handing over after
every epoch's evaluation: epoch 1 of A, B, C, then epoch 2 of A, B, C, ..., so that a drift
in load hits every strategy alike. Time spent waiting is excluded from both clocks, and each
run's global RNG state is saved and restored around its waits, so it draws the same random
numbers (initialisation, data order, augmentation) as it would alone.

`time_training` is the same configuration and clock without evaluation, for throughput
measurements (`benchmarks/bench_selection_pass.py`).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import logging
import os
import platform
import random
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager

import numpy as np
import torch
from transformers import TrainerCallback, default_data_collator, set_seed

from hf_selective_backprop.cards import training_costs
from hf_selective_backprop.metrics import compute_metrics
from hf_selective_backprop.trainer import SelectiveBackpropTrainer

from .provenance import provenance
from .settings import RunSettings
from .strategies import Strategy
from .workloads import Workload

LOG_VERSION = 1
logger = logging.getLogger(__name__)


class Turnstile:
    """Round-robin turns among named runs: one runs, the others wait."""

    def __init__(self, names):
        self.order = list(names)
        self.current = 0
        self._cond = threading.Condition()

    def wait(self, name: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.order[self.current] == name)

    def pass_on(self, name: str) -> None:
        with self._cond:
            self.current = (self.order.index(name) + 1) % len(self.order)
            self._cond.notify_all()

    def leave(self, name: str) -> None:
        with self._cond:
            i = self.order.index(name)
            self.order.pop(i)
            if i < self.current:
                self.current -= 1
            if self.order:
                self.current %= len(self.order)
            self._cond.notify_all()


def _rng_state():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _set_rng_state(state) -> None:
    torch.set_rng_state(state[0])
    random.setstate(state[1])
    np.random.set_state(state[2])


class _Clock:
    """Wall and CPU seconds since `start()`, minus excluded spans (evaluation)."""

    def __init__(self):
        self.wall0 = self.cpu0 = None
        self.excluded_wall = self.excluded_cpu = 0.0

    def start(self) -> None:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def now(self) -> tuple[float, float]:
        return (
            time.perf_counter() - self.wall0 - self.excluded_wall,
            time.process_time() - self.cpu0 - self.excluded_cpu,
        )

    @contextmanager
    def excluded(self):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.excluded_wall += time.perf_counter() - wall
            self.excluded_cpu += time.process_time() - cpu


class _TimingCallback(TrainerCallback):
    """Starts the clock when the training loop starts; times optimizer steps."""

    def __init__(self, trainer: BenchmarkTrainer):
        self.trainer = trainer
        self._step_start = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.clock.start()

    def on_epoch_end(self, args, state, control, **kwargs):
        # Before this epoch's evaluation, which the clock excludes anyway; the last reading is the
        # loop's training time without the Trainer's wrap-up (throughput runs do not evaluate).
        self.trainer.loop_seconds = self.trainer.clock.now()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._step_start = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self._step_start is not None:
            self.trainer.timings["optimizer_seconds"] += time.perf_counter() - self._step_start
            self._step_start = None


class _EvaluateEveryFraction(TrainerCallback):
    """Evaluates each time another 1/k of an epoch of data has been read.

    The marks are in data read (`state.epoch`, which a selective run advances by the rows it
    read, not the steps it made), so every strategy is evaluated at the same points of its data.
    """

    def __init__(self, evals_per_epoch: float):
        self.every = 1.0 / evals_per_epoch
        self.next_mark = self.every

    def on_step_end(self, args, state, control, **kwargs):
        if (state.epoch or 0.0) >= self.next_mark - 1e-9:
            control.should_evaluate = True
            while self.next_mark <= (state.epoch or 0.0) + 1e-9:
                self.next_mark += self.every
        return control


class BenchmarkTrainer(SelectiveBackpropTrainer):
    """Records (epoch, accuracy, training time) at every evaluation, and a time breakdown.

    ``train_step_seconds`` is the training forward + backward (`training_step`),
    ``optimizer_seconds`` the optimizer step, ``batch_seconds`` the time spent assembling
    training batches (for Traditional: reading data; for selection strategies it includes
    the selection forwards and bookkeeping, which `sb_stats` itemises).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.clock = _Clock()
        self.turnstile: Turnstile | None = None
        self.run_name = ""
        self.evals: list[dict] = []
        self.timings = {"train_step_seconds": 0.0, "optimizer_seconds": 0.0, "batch_seconds": 0.0}
        self.loop_seconds: tuple[float, float] | None = None  # (wall, CPU) at the last epoch's end
        #: Unaugmented training rows whose fit every evaluation also measures, collated once in evaluation
        #: batches (None: the evaluation split only); once is enough, as nothing about them is random.
        self.fit_rows: list[dict[str, torch.Tensor]] | None = None
        #: The median loss on `fit_rows` at the first evaluation: later evaluations count the rows below it.
        self.first_median_loss: float | None = None
        self.add_callback(_TimingCallback(self))

    def training_step(self, model, inputs, num_items_in_batch=None):
        start = time.perf_counter()
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            self.timings["train_step_seconds"] += time.perf_counter() - start

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        start = time.perf_counter()
        try:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        finally:
            self.timings["batch_seconds"] += time.perf_counter() - start

    def evaluate(self, *args, **kwargs):
        if self.clock.wall0 is None:
            return super().evaluate(*args, **kwargs)
        train_wall, train_cpu = self.clock.now()
        start = time.perf_counter()
        with self.clock.excluded():
            metrics = super().evaluate(*args, **kwargs)
        self.evals.append(
            {
                "epoch": float(self.state.epoch or 0.0),
                "step": int(self.state.global_step),
                "accuracy": float(metrics["eval_accuracy"]),
                "error": 1.0 - float(metrics["eval_accuracy"]),
                "eval_loss": float(metrics.get("eval_loss", float("nan"))),
                "train_wall_seconds": train_wall,
                "train_cpu_seconds": train_cpu,
                "eval_wall_seconds": time.perf_counter() - start,
                **(self._training_fit() if self.fit_rows is not None else {}),
            }
        )
        if self.turnstile is not None:
            with self.clock.excluded():  # waiting for the other runs is no one's training time
                state = _rng_state()
                self.turnstile.pass_on(self.run_name)
                self.turnstile.wait(self.run_name)
                _set_rng_state(state)
        return metrics

    def _training_fit(self) -> dict:
        """Accuracy and the share of losses below `FIT_LOSS` on `fit_rows`, in eval mode (whether training
        has converged: the paper's regime is one where most examples are learned)."""
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        # What the forward takes: a row's index or other bookkeeping columns stay out.
        accepted = set(inspect.signature(model.forward).parameters) - {"labels"}
        correct = rows = 0
        losses = []
        with self.clock.excluded(), torch.no_grad():
            for batch in self.fit_rows:
                targets = batch["labels"].to(self.args.device)
                inputs = {key: value.to(self.args.device) for key, value in batch.items() if key in accepted}
                logits = model(**inputs).logits
                losses.append(torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none").cpu())
                correct += int((logits.argmax(-1) == targets).sum())
                rows += len(targets)
        model.train(was_training)
        losses = torch.cat(losses)
        if self.first_median_loss is None:
            self.first_median_loss = float(losses.median())
        return {
            "train_accuracy": correct / rows,
            "train_low_loss_share": float((losses < FIT_LOSS).float().mean()),
            # Redundancy as learning proceeds: rows now easier than the typical row was at the first evaluation.
            "train_below_first_median_share": float((losses < self.first_median_loss).float().mean()),
            "train_first_median_loss": self.first_median_loss,
        }


#: An example counts as learned below this loss (the share of such examples is convergence evidence).
FIT_LOSS = 0.1


def _own_augmentation(dataset, seed: int):
    """A view of `dataset` whose augmentation draws from its own generator, seeded as loaded.

    The data is decoded once and shared by every run of a benchmark; without this the runs
    would share (and, interleaved, interleave) one augmentation random stream.
    """
    transform = getattr(dataset, "transform", None)
    if transform is None or not hasattr(transform, "generator"):
        return dataset
    view = copy.copy(dataset)
    view.transform = copy.copy(transform)
    view.transform.generator = torch.Generator().manual_seed(seed)
    return view


def _fit_rows(workload: Workload, count: int, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """The first ``count`` training rows (an image dataset's `without_augmentation`; text has none), collated as
    the workload collates them, in batches of ``batch_size``."""
    dataset = workload.train
    if count > len(dataset):
        raise ValueError(f"--train_eval_samples {count} is more than the {len(dataset)} training rows")
    if hasattr(dataset, "without_augmentation"):
        dataset = dataset.without_augmentation()
    collate = workload.data_collator or default_data_collator
    return [
        collate(dataset.__getitems__(list(range(start, min(start + batch_size, count)))))
        for start in range(0, count, batch_size)
    ]


def _stats(trainer: BenchmarkTrainer) -> dict:
    """The run's counters (`cards.training_costs`: a Traditional run's too), with the data and selection timers
    that a Traditional run's counters lack filled in."""
    stats = training_costs(trainer)
    if stats["strategy"] == "none":  # the data time the trainer's own counters keep for selective runs
        stats.update(data_seconds=trainer.timings["batch_seconds"], selection_forward_seconds=0.0,
                     selection_overhead_seconds=0.0)
    return stats


def run_strategy(
    strategy: Strategy,
    workload: Workload,
    settings: RunSettings,
    num_train_epochs: float,
    extra: dict | None = None,
    turnstile: Turnstile | None = None,
) -> dict:
    """Train `strategy` for `num_train_epochs` and return its log (what `<name>.json` holds).

    With a `turnstile`, waits for its turn first and hands over after every evaluation.
    """
    if turnstile is not None:
        turnstile.wait(strategy.name)
    # The Trainer's own output (sb_stats.json, already in the log) stays out of the results folder.
    run_dir = tempfile.mkdtemp(prefix=f"benchmark-{strategy.name}-")
    config = settings.config(run_dir, num_train_epochs, strategy.overrides)
    set_seed(settings.seed)
    trainer = BenchmarkTrainer(
        model=workload.build_model(),
        args=config,
        train_dataset=_own_augmentation(workload.train, settings.seed),
        eval_dataset=workload.eval,
        data_collator=workload.data_collator,
        processing_class=workload.processing_class,
        compute_metrics=compute_metrics,
    )
    if settings.evals_per_epoch > 0 and settings.evals_per_epoch != 1:
        trainer.add_callback(_EvaluateEveryFraction(settings.evals_per_epoch))
    trainer.turnstile, trainer.run_name = turnstile, strategy.name
    if settings.train_eval_samples:
        trainer.fit_rows = _fit_rows(workload, settings.train_eval_samples, config.per_device_eval_batch_size)
    load_before = os.getloadavg()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    trainer.train()
    # An epoch-based run ends when its data does; a fractional last epoch still gets evaluated.
    if not trainer.evals or trainer.evals[-1]["epoch"] < float(trainer.state.epoch or 0.0) - 1e-6:
        trainer.evaluate()
    train_wall, train_cpu = trainer.evals[-1]["train_wall_seconds"], trainer.evals[-1]["train_cpu_seconds"]
    stats = _stats(trainer)
    reference = reference_cost(config.sb_reference_model, stats)
    if reference is not None:
        # The reference model's training and its pass over the data are part of what this strategy costs.
        for entry in trainer.evals:
            entry["train_wall_seconds"] += reference["seconds"]
            entry["train_cpu_seconds"] += reference["seconds"]
        train_wall, train_cpu = train_wall + reference["seconds"], train_cpu + reference["seconds"]
    rows = len(workload.train)
    epochs = float(trainer.state.epoch or 0.0)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "version": LOG_VERSION,
        "strategy": strategy.name,
        "label": strategy.label,
        "overrides": strategy.overrides,
        "cycle": strategy.cycle,
        "num_train_epochs": num_train_epochs,
        "epochs_trained": epochs,
        "train_examples": rows,
        "eval_examples": len(workload.eval) if workload.eval is not None else 0,
        "settings": settings.logged(),
        "model": workload.model_name,
        "dataset": workload.dataset_id,
        "evals": trainer.evals,
        "train_wall_seconds": train_wall,
        "train_cpu_seconds": train_cpu,
        "process_wall_seconds": time.perf_counter() - wall0,
        "process_cpu_seconds": time.process_time() - cpu0,
        "timings": trainer.timings,
        "stats": stats,
        "reference": reference,
        "interleaved_with": list(turnstile.order) if turnstile is not None else [],
        "provenance": provenance(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        **(extra or {}),
    }


def reference_cost(folder: str | None, stats: dict) -> dict | None:
    """What a RHO-LOSS reference model cost: its training (wall seconds, from the train_results.json that
    scripts/train.py writes) and its pass over this run's data, and which rows it trained on.

    The training run's CPU time is not recorded, so both clocks are charged its wall time (on an idle
    machine at one thread the two agree within a fraction of a percent).
    """
    if folder is None:
        return None
    results = os.path.join(folder, "train_results.json")
    if not os.path.isfile(results):
        raise ValueError(
            f"--reference_model {folder!r} has no train_results.json, so its training time cannot be counted: "
            "train it with scripts/train.py"
        )
    with open(results) as handle:
        training = float(json.load(handle)["train_runtime"])
    holdout = os.path.join(folder, "holdout.json")
    trained_on = None
    if os.path.isfile(holdout):
        with open(holdout) as handle:
            record = json.load(handle)
        trained_on = {key: record[key] for key in ("holdout_fraction", "holdout_seed", "train_on", "max_train_samples")}
        trained_on["rows"] = len(record["holdout_ids"])
    scoring = float(stats.get("reference_seconds", 0.0))
    return {
        "folder": folder,
        "training_seconds": training,
        "scoring_seconds": scoring,
        "seconds": training + scoring,
        "trained_on": trained_on,
    }


def time_training(
    strategy: Strategy, settings: RunSettings, model: torch.nn.Module, train_dataset, num_train_epochs: float
) -> dict:
    """Train `model` in place without evaluating; the loop's time and the trainer's counters.

    For throughput measurements: the configuration (`RunSettings.config`) and the clock (`BenchmarkTrainer`:
    from the training loop's start to the last epoch's end, so the Trainer's set-up and wrap-up are
    left out) are those of the time-to-accuracy runs. The caller seeds and initialises `model`.
    """
    with tempfile.TemporaryDirectory(prefix=f"throughput-{strategy.name}-") as run_dir:
        config = dataclasses.replace(settings, evals_per_epoch=0).config(run_dir, num_train_epochs, strategy.overrides)
        trainer = BenchmarkTrainer(model=model, args=config, train_dataset=train_dataset)
        trainer.train()
    wall, cpu = trainer.loop_seconds
    stats = _stats(trainer)
    return {
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "examples": stats["examples_seen"],
        "trained": stats["backwards"],
        "examples_per_second": stats["examples_seen"] / wall,
        "stats": stats,
        "timings": dict(trainer.timings),
    }


def write_log(log: dict, path: str) -> None:
    """Atomically: a killed run never leaves a half-written log that would be skipped."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(log, handle, indent=1)
    os.replace(tmp, path)


def run_interleaved(jobs, workload: Workload, settings: RunSettings, on_done) -> None:
    """Train every `(strategy, epochs, extra)` of `jobs` in turns of one epoch (see the module doc).

    `on_done(strategy, log)` runs in the finishing run's thread while it still holds the turn;
    a run that raises is logged and leaves the rotation without stopping the others.
    """
    turnstile = Turnstile([s.name for s, _, _ in jobs])

    def work(strategy, epochs, extra):
        try:
            log = run_strategy(strategy, workload, settings, epochs, extra, turnstile)
            on_done(strategy, log)
        except Exception:
            logger.exception("%s failed; the other strategies go on", strategy.name)
        finally:
            turnstile.leave(strategy.name)

    threads = [threading.Thread(target=work, args=job, name=f"bench-{job[0].name}") for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
