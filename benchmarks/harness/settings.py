"""`RunSettings`: what every run of one benchmark shares, and the one place it becomes a `SelectiveBackpropConfig`.

`benchmarks/benchmark.py` and `benchmarks/benchmark_text.py` read these fields as flags (`BenchmarkArguments`
extends this class); `benchmarks/bench_selection_pass.py`, `benchmarks/gpu_throughput.py` and
`benchmarks/gpu_diagnostics.py` build one in code. Every run's log records the fields (but the output
folder) under ``settings``. Importing this module needs neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hf_selective_backprop.config import SelectiveBackpropConfig


@dataclass
class RunSettings:
    """What every strategy of one benchmark shares (the paper's CIFAR-10 recipe by default)."""

    output_dir: str = field(metadata={"help": "Where <strategy>.json logs, report.md and the PNGs go."})
    num_train_epochs: float = field(default=10.0, metadata={"help": "Epochs of every run (paper protocol)."})
    seed: int = field(default=42, metadata={"help": "Seed of every run (model init, data order, selection)."})
    batch_size: int = field(default=128, metadata={"help": "Training batch size."})
    eval_batch_size: int = field(default=256, metadata={"help": "Evaluation batch size."})
    learning_rate: float = field(default=0.1, metadata={"help": "Peak SGD learning rate."})
    momentum: float = field(default=0.9, metadata={"help": "SGD momentum."})
    weight_decay: float = field(default=5e-4, metadata={"help": "Weight decay."})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "LR schedule over each run's epochs."})
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
            "whose final error is all that is read; throughput runs, `time_training`, do not evaluate at all)."
        },
    )
    use_cpu: bool | None = field(
        default=None, metadata={"help": "Train on the CPU (default: on the GPU when there is one)."}
    )
    lr_decay_milestones: list[float] | None = field(
        default=None,
        metadata={
            "help": "Step decay on top of --lr_scheduler_type at these shares of each run (the paper's CIFAR-10 "
            "schedule: --lr_scheduler_type constant --lr_decay_milestones 0.3 0.6 0.8 --lr_decay_factor 0.2)."
        },
    )
    lr_decay_factor: float = field(default=0.2, metadata={"help": "Factor of each --lr_decay_milestones decay."})
    sb_budget: float | None = field(
        default=None,
        metadata={
            "help": "Every run costs this share, in (0, 1], of a plain run of --num_train_epochs (the trainer's "
            "--sb_budget: sized before training, its schedule ending inside the budget; 'traditional' becomes the "
            "budget-matched baseline). Default: no budget."
        },
    )
    sb_cost_phi: float | None = field(
        default=None,
        metadata={"help": "With --sb_budget: a selection forward's cost per training step (the trainer's flag)."},
    )
    train_eval_samples: int = field(
        default=0,
        metadata={
            "help": "Also log, at every evaluation, the accuracy and the share of losses below 0.1 on the first N "
            "training rows (images without augmentation) (convergence evidence). 0: off."
        },
    )

    def __post_init__(self):
        if self.train_eval_samples < 0:
            raise ValueError(f"--train_eval_samples must be >= 0, got {self.train_eval_samples}")
        if self.lr_decay_milestones is not None:
            from hf_selective_backprop.lr_schedule import check_milestones

            self.lr_decay_milestones = list(self.lr_decay_milestones)
            check_milestones(self.lr_decay_milestones, self.lr_decay_factor)
        if self.sb_budget is not None and not 0.0 < self.sb_budget <= 1.0:
            raise ValueError(f"--sb_budget must be in (0, 1] (a share of the full run's cost), got {self.sb_budget!r}")
        if not 0 <= self.evals_per_epoch < float("inf"):
            raise ValueError(f"--evals_per_epoch must be >= 0, got {self.evals_per_epoch}")

    def run_settings(self) -> RunSettings:
        """These settings alone (a subclass, `BenchmarkArguments`, adds the benchmark's own flags)."""
        return RunSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RunSettings)})

    def logged(self) -> dict:
        """What a run's log records under ``settings``: every field but the output folder."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(RunSettings) if f.name != "output_dir"}

    def config(self, run_dir: str, num_train_epochs: float, overrides: dict | None = None) -> SelectiveBackpropConfig:
        """The Trainer's arguments of one run: these settings, the benchmark's fixed choices (no checkpoints, no
        progress bar, no reporting), then ``overrides`` (a strategy's ``sb_*`` flags, or anything else)."""
        import torch

        from hf_selective_backprop.config import SelectiveBackpropConfig

        arguments = dict(
            output_dir=run_dir,
            num_train_epochs=num_train_epochs,
            per_device_train_batch_size=self.batch_size,
            per_device_eval_batch_size=self.eval_batch_size,
            learning_rate=self.learning_rate,
            weight_decay=self.weight_decay,
            optim=self.optim,
            optim_args=f"momentum={self.momentum}" if self.optim.startswith("sgd") else None,
            lr_scheduler_type=self.lr_scheduler_type,
            lr_decay_milestones=list(self.lr_decay_milestones) if self.lr_decay_milestones else None,
            lr_decay_factor=self.lr_decay_factor,
            warmup_steps=self.warmup_steps,
            # Other than one evaluation per epoch: `runner._EvaluateEveryFraction` decides when.
            eval_strategy="epoch" if self.evals_per_epoch == 1 else "no",
            save_strategy="no",
            logging_steps=50,
            report_to="none",
            seed=self.seed,
            data_seed=self.seed,
            use_cpu=not torch.cuda.is_available() if self.use_cpu is None else self.use_cpu,
            disable_tqdm=True,
            dataloader_num_workers=0,
            # On a GPU the loader copies each batch from pinned memory without making the host wait (docs/gpu.md).
            accelerator_config={"non_blocking": torch.cuda.is_available()},
            sb_budget=self.sb_budget,
            sb_cost_phi=self.sb_cost_phi,
        )
        arguments.update(overrides or {})
        return SelectiveBackpropConfig(**arguments)
