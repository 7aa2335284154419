"""Two sections of `make gpu-check` (docs/gpu.md): training runs on a CUDA device that check the trainer there.

    python benchmarks/gpu_diagnostics.py --section precision|syncs --output_dir OUT [--data CIFAR10]

- ``precision``: bf16 and fp16 training with sb, Stale-SB and infobatch on 4,096 CIFAR-10 images: finite
  losses, counters, the fp16 loss scaler's skipped steps;
- ``syncs``: host synchronisations per selection batch and per optimizer step
  (``torch.cuda.set_sync_debug_mode``), with the line of code that made each.

Writes OUT/<section>.json, which benchmarks/gpu_check.py puts into its report. Without a CUDA device it
prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from pathlib import Path

import torch

from harness.gpu_report import run_section
from harness.settings import RunSettings
from harness.workloads import cifar10_workload

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--section", choices=("precision", "syncs"), required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--data", default="uoft-cs/cifar10", help="CIFAR-10 in the Hub's layout (a folder or Hub id)")
    options = parser.parse_args()
    section = {"precision": precision, "syncs": syncs}[options.section]
    run_section(options.section, options.output_dir, lambda out: section(options.data, out))
    return 0


def train(workload, output_dir: str, hook=None, engine_class=None, **overrides):
    """Train on ``workload`` with the benchmarks' settings (batch 128, SGD as in the paper), 2 epochs, seed 0, the
    loader's blocking copies; ``overrides`` win; ``hook(trainer)`` runs before training starts."""
    from hf_selective_backprop import SelectiveBackpropTrainer

    settings = RunSettings(output_dir=output_dir, num_train_epochs=2, seed=0, evals_per_epoch=0)
    overrides = {"logging_steps": 10, "accelerator_config": {"non_blocking": False}, **overrides}
    epochs = overrides.pop("num_train_epochs", settings.num_train_epochs)
    trainer_cls = SelectiveBackpropTrainer
    if engine_class is not None:
        trainer_cls = type("CheckTrainer", (SelectiveBackpropTrainer,), {"engine_class": engine_class})
    trainer = trainer_cls(model=workload.build_model(), args=settings.config(output_dir, epochs, overrides),
                          train_dataset=workload.train)
    if hook is not None:
        hook(trainer)
    trainer.train()
    return trainer


def precision(data: str, out: Path) -> dict:
    from transformers import TrainerCallback

    class SkippedSteps(TrainerCallback):
        def __init__(self, trainer):
            self.trainer, self.skipped = trainer, 0

        def on_step_end(self, args, state, control, **kwargs):
            self.skipped += int(self.trainer.accelerator.optimizer_step_was_skipped)

    workload = cifar10_workload(data, 4096)
    runs = []
    strategies = {
        "sb": {"sb_strategy": "sb"},
        "stale-sb": {"sb_strategy": "sb", "sb_staleness": 3, "num_train_epochs": 3},
        "infobatch": {"sb_strategy": "infobatch"},
    }
    for precision in ("bf16", "fp16"):
        for name, overrides in strategies.items():
            counters = []
            trainer = train(workload, str(out / "runs" / f"{precision}-{name}"),
                            hook=lambda t, found=counters: (found.append(SkippedSteps(t)), t.add_callback(found[-1])),
                            logging_steps=1, **{precision: True, **overrides})
            losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
            scaler = trainer.accelerator.scaler
            stats = trainer.sb_stats
            runs.append({
                "precision": precision, "strategy": name, "logged_losses": len(losses),
                "losses_finite": bool(losses) and all(math.isfinite(x) for x in losses),
                "last_loss": losses[-1] if losses else None, "skipped_steps": counters[0].skipped,
                "loss_scale": scaler.get_scale() if scaler is not None else None,
                **{k: stats[k] for k in ("examples_seen", "selection_forwards", "kept", "backwards",
                                         "optimizer_steps", "nonfinite_losses")},
            })
    return {"train_examples": len(workload.train), "runs": runs}


def syncs(data: str, out: Path) -> dict:
    from hf_selective_backprop.engine import SelectionEngine

    class CountingEngine(SelectionEngine):
        def add_batch(self, batch, selecting, model):
            Phase.batches += 1
            return super().add_batch(batch, selecting, model)

    class Phase:
        current, batches, sites = "step", 0, []

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            Phase.sites.append((Phase.current, f"{os.path.relpath(filename, ROOT)}:{lineno}"))

    def in_batch_phase(trainer):
        original = trainer.get_batch_samples

        def get_batch_samples(*args, **kwargs):
            Phase.current = "batch"
            try:
                return original(*args, **kwargs)
            finally:
                Phase.current = "step"

        trainer.get_batch_samples = get_batch_samples

    workload = cifar10_workload(data, 2048)
    runs = {}
    for name, overrides in {
        "traditional": {"sb_strategy": "none"},
        "sb": {"sb_strategy": "sb"},
        "sb, non-blocking loader": {"sb_strategy": "sb", "accelerator_config": {"non_blocking": True}},
        "stale-sb": {"sb_strategy": "sb", "sb_staleness": 2},
        "infobatch": {"sb_strategy": "infobatch"},
    }.items():
        Phase.batches, Phase.sites = 0, []
        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trainer = train(workload, str(out / "runs" / name), in_batch_phase, CountingEngine, **overrides)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        steps = trainer.state.global_step
        batches = Phase.batches or steps  # Traditional: one loaded batch per step
        sites: dict[str, dict[str, int]] = {"batch": {}, "step": {}}
        for phase, site in Phase.sites:
            sites[phase][site] = sites[phase].get(site, 0) + 1
        in_batches = sum(sites["batch"].values())
        runs[name] = {
            "selection_batches": batches, "optimizer_steps": steps,
            "per_selection_batch": in_batches / max(batches, 1),
            "per_optimizer_step_outside_batches": sum(sites["step"].values()) / max(steps, 1),
            "sites": {phase: dict(sorted(found.items(), key=lambda kv: -kv[1])) for phase, found in sites.items()},
        }
    return {"train_examples": len(workload.train), "epochs": 2, "runs": runs}


if __name__ == "__main__":
    sys.exit(main())
