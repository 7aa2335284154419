"""The `sb_*` flags of every strategy (`SelectiveBackpropArguments`) and `SelectiveBackpropConfig`.

`SelectiveBackpropArguments` is a dataclass mixin: combined with any `TrainingArguments` subclass
(TRL's `SFTConfig`, `Seq2SeqTrainingArguments`, ...) it adds the flags and checks them after the
base class's own `__post_init__`, so `HfArgumentParser` parses both sets of flags at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from transformers import TrainingArguments

from .config_checks import (
    DEFAULT_KEEP,
    HISTORY_SCOPES,
    RHO_RULES,
    SELECTION_MODES,
    SELECTION_PRECISIONS,
    check_selective_arguments,
)
from .default_strategy import DEFAULT_STRATEGY, CannotSelect
from .record.scores import PRUNE_SCORES


@dataclass
class SelectiveBackpropArguments:
    """The `sb_*` flags, to mix into a `TrainingArguments` subclass (listed first among the bases).

    An *epoch* is one pass of the training data through selection: every example is either
    scored by a selection forward or (in a Stale-SB epoch) looked up in the loss store. The
    learning-rate schedule is sized from the expected number of optimizer steps.
    """

    sb_strategy: str = field(
        # Not the paper's 'sb': at keep 1/3 it stalled fine-tuning a text classifier with a new head (SST-2 at a
        # 50/50 answer, 19 points below Traditional) and SFT; InfoBatch collapsed no workload measured.
        default=DEFAULT_STRATEGY,
        metadata={
            "help": "Selection strategy: 'none' (Traditional: every example trained, no selection pass), "
            "'sb' (Selective-Backprop: keep with probability CDF(loss)**beta), 'topk' (highest-loss "
            "fraction of each selection batch), 'composer' (MosaicML's rule), 'kath18' (Katharopoulos & "
            "Fleuret importance sampling), 'uniform' (random fraction: the control baseline), 'infobatch' "
            "(Qin et al. 2024: prune below-mean-loss examples before loading, rescale the rest), 'rholoss' "
            "(Mindermann et al. 2022: select by reducible loss = loss minus a reference model's loss, which "
            "skips mislabeled examples; needs --sb_reference_model or --sb_reference_column), 'early_prune' "
            "(pruning by early loss, after Data Diet, in one run: the first epoch on everything, then the "
            "sb_keep share with the highest first-epoch loss for every later epoch), 'early_coverage' (the same "
            "with a coverage-centric choice over the first-epoch losses, after CCS: the hardest tenth dropped, "
            "every level of difficulty kept), 'early_class_budget' (the same share budgeted class by class, after "
            "NUCS: each class's share set by its difficulty, chosen by coverage inside it; needs one class label "
            "per example), 'early_random' (the same with a random subset of that size: their "
            "control), or the name "
            "of a strategy registered with hf_selective_backprop.selectors.register_strategy. Default: "
            "'infobatch', the one strategy that collapsed no workload measured, at a smaller saving than 'sb' where "
            "'sb' works; 'sb' at the paper's setting stalled fine-tuning a text classifier (the measurements: "
            "docs/results.md, 'The default strategy').",
        },
    )
    sb_keep: float | None = field(
        default=None,
        metadata={
            "help": "Fraction of examples to train on, in (0, 1], for every strategy but 'infobatch' (which "
            "prunes by --sb_prune_ratio and warns that --sb_keep does not apply). For 'sb' it sets "
            "beta = 1/keep - 1; for 'kath18' presample = 1/keep. Default: 1/(sb_beta+1) if sb_beta is "
            "given, else 1/3 (the paper's CIFAR-10 selectivity)."
        },
    )
    sb_beta: float | None = field(
        default=None,
        metadata={
            "help": "Selectivity exponent of 'sb' (> 0): P = CDF(loss)**beta. The expected kept fraction is "
            "1/(beta+1): beta=1, 2, 3 keep a half, a third, a quarter. Default: derived from sb_keep (beta=2)."
        },
    )
    sb_history_size: int = field(
        default=1024,
        metadata={"help": "R: number of recent losses whose empirical CDF scores a loss ('sb'). >= 1."},
    )
    sb_min_prob: float = field(
        default=0.0,
        metadata={"help": "Floor of the selection probability ('sb'), in [0, 1]."},
    )
    sb_staleness: int = field(
        default=1,
        metadata={
            "help": "n: run selection forwards only every n-th epoch and select from stored losses in the "
            "others (Stale-SB). 1 = plain SB. >= 1."
        },
    )
    sb_selection_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Examples per selection forward, per device. Default: per_device_train_batch_size "
            "('kath18': presample x per_device_train_batch_size)."
        },
    )
    sb_selection_mode: str = field(
        default="eval",
        metadata={
            "help": "Model mode of the selection forward: 'eval' (BatchNorm statistics and dropout untouched, "
            "as in the authors' code) or 'train' (BatchNorm's running statistics then follow every example "
            "read, not only the kept ones; near convergence on CIFAR-10 it made SB more accurate at the same cost, "
            "docs/results.md).",
            "choices": list(SELECTION_MODES),
        },
    )
    sb_warmup_epochs: int = field(
        default=0,
        metadata={
            "help": "Epochs trained on all data before selection starts (the authors primed 1). >= 0."
        },
    )
    sb_index_column: str = field(
        default="index",
        metadata={
            "help": "Column holding a stable int64 id per training example. Added automatically (0..N-1) "
            "when the training dataset lacks it."
        },
    )
    sb_start: float = field(
        default=0.0,
        metadata={
            "help": "Share of the run after which selection turns on, in [0, 1). The share is of the data read "
            "(epochs read / num_train_epochs) in an epoch-based run, of optimizer steps (step / max_steps) "
            "with --max_steps, of the budget spent with --sb_budget."
        },
    )
    sb_end: float = field(
        default=1.0,
        metadata={
            "help": "Share of the run after which selection turns off again, in (sb_start, 1]; measured like "
            "sb_start (data read in an epoch-based run, optimizer steps with --max_steps, budget spent with "
            "--sb_budget)."
        },
    )
    sb_interrupt: int = field(
        default=0,
        metadata={"help": "If k > 0, every k-th optimizer step trains on a plain unselected batch. >= 0."},
    )
    sb_presample: float | None = field(
        default=None,
        metadata={
            "help": "'kath18': score presample x batch examples per optimizer batch (> 1). Default 1/sb_keep (3)."
        },
    )
    sb_importance_weighting: bool = field(
        default=False,
        metadata={
            "help": "Weight each trained example's loss by 1/(N p_i) so the expected gradient is unbiased "
            "('kath18': the importance weights; 'sb': weights 1/P_i normalised over the kept batch)."
        },
    )
    sb_variance_start: bool = field(
        default=False,
        metadata={
            "help": "'kath18': sample uniformly until the estimated variance reduction exceeds (B+3b)/(3b)."
        },
    )
    sb_selection_precision: str = field(
        default="auto",
        metadata={
            "help": "Precision of the selection forward: 'auto' (the training precision), 'fp32', or autocast "
            "to 'bf16' / 'fp16'.",
            "choices": list(SELECTION_PRECISIONS),
        },
    )
    sb_selection_scale: float = field(
        default=1.0,
        metadata={"help": "Resize images by this factor for the selection forward only, in (0, 1]."},
    )
    sb_selection_channels_last: bool = field(
        default=False,
        metadata={"help": "Run the selection forward on channels_last image tensors."},
    )
    sb_selection_inference_mode: bool = field(
        default=False,
        metadata={"help": "Run the selection forward under torch.inference_mode instead of torch.no_grad."},
    )
    sb_sync_timers: bool = field(
        default=False,
        metadata={
            "help": "Wait for the accelerator at the start and end of each timed phase, so the time split in "
            "sb_stats (data, selection forward, selection overhead) measures the work rather than the launch of "
            "asynchronous kernels. Costs two host synchronisations per timed phase; no effect on a CPU."
        },
    )
    sb_history_scope: str = field(
        default="global",
        metadata={
            "help": "With several processes: 'global' builds the loss CDF from the losses of all ranks, "
            "'local' from each rank's own.",
            "choices": list(HISTORY_SCOPES),
        },
    )

    sb_prune_ratio: float = field(
        default=0.5,
        metadata={
            "help": "'infobatch': probability r, in [0, 1), of dropping an example whose latest training loss is "
            "below the mean; kept ones get loss weight 1/(1-r)."
        },
    )
    sb_anneal_delta: float | None = field(
        default=None,
        metadata={
            "help": "'infobatch' and the early strategies: the share of the epochs, in [0, 1], before "
            "annealing; the epochs from delta x num_train_epochs on train on all data, unweighted (InfoBatch's "
            "annealing). On a stream (step-based, --max_steps) the steps from delta x max_steps on. Default: "
            "0.875 for 'infobatch' (the paper's), 1 (no annealing) for the early strategies."
        },
    )

    sb_reference_model: str | None = field(
        default=None,
        metadata={
            "help": "'rholoss': folder of a saved model (what save_pretrained writes) trained on a holdout split "
            "of the data. Before training it scores every training example once (eval mode, no augmentation); "
            "its loss is the example's irreducible loss, kept in checkpoints and never recomputed on resume."
        },
    )
    sb_reference_column: str | None = field(
        default=None,
        metadata={
            "help": "'rholoss': training-dataset column holding each example's irreducible loss (a finite float), "
            "instead of --sb_reference_model."
        },
    )
    sb_rho_rule: str = field(
        default="cdf",
        metadata={
            "help": "'rholoss': how reducible losses pick rows. 'cdf' (default) keeps each with probability "
            "CDF(reducible loss)**beta, the SB rule on reducible losses; 'topk' keeps the sb_keep highest of each "
            "selection batch (RHO-LOSS's own rule). 'cdf' is the default as the more accurate of the two on CIFAR-10 "
            "with label noise (docs/strategies.md).",
            "choices": list(RHO_RULES),
        },
    )

    sb_budget: float | None = field(
        default=None,
        metadata={
            "help": "Compute budget F, in (0, 1]: the run costs F times the configured full run (plain training "
            "for --num_train_epochs, or --max_steps, over the same data), counted as backward passes plus "
            "--sb_cost_phi x selection forwards (and the 'rholoss' reference pass). Before training the run "
            "is sized so that the strategy's expected cost meets the budget, the learning-rate schedule (any "
            "--lr_scheduler_type, warm-up and --lr_decay_milestones included) follows the budget spent and "
            "ends inside it, and training stops when it is spent, with the final save and evaluation as usual. "
            "With --sb_strategy none: plain training for F of the full run's optimizer steps, the schedule "
            "fitted to them (the budget-matched baseline). A stream needs --max_steps. Default: no budget."
        },
    )
    sb_cost_phi: float | None = field(
        default=None,
        metadata={
            "help": "With --sb_budget: the cost of one example's selection forward over that of one example's "
            "training step (forward and backward), > 0. Default: measured on the run's first optimizer steps "
            "(from the third, over ten or more, on every process), the plan then made anew from it and kept in "
            "checkpoints; until then the cost model's 1/3 (a backward costing two forwards, Jiang et al., 2019, "
            "section 3). Give a value for a run whose plan and length must not depend on the machine's clock "
            "(benchmarks/bench_selection_pass.py measures one)."
        },
    )

    lr_decay_milestones: list[float] | None = field(
        default=None,
        metadata={
            "help": "Step decay on top of --lr_scheduler_type: the learning rate is multiplied by "
            "--lr_decay_factor at each of these shares of the run, increasing and in (0, 1). The paper's CIFAR-10 "
            "schedule (lr 0.1, divided by 5 at epochs 60/120/160 of 200) is --lr_scheduler_type constant "
            "--lr_decay_milestones 0.3 0.6 0.8 --lr_decay_factor 0.2. Under selection the shares are of the "
            "data read, so the decays fall on the same epochs whatever a strategy keeps. Default: no decay."
        },
    )
    lr_decay_factor: float = field(
        default=0.2,
        metadata={"help": "Factor of each --lr_decay_milestones decay, in (0, 1]."},
    )

    sb_record: bool = field(
        default=True,
        metadata={
            "help": "Keep the example record: per training example (keyed by --sb_index_column), the losses training "
            "measured (a selection forward's, else the training forward's; every strategy, 'none' included, whose "
            "training it leaves bit for bit that of the plain Trainer), how often it was scored and backpropagated, "
            "confidence, variability, correctness, the epoch it was first learned, its forgetting events and, for "
            "single-label classification, its area under the margin (AUM). "
            "Written at the end to example_record.parquet (and data_map.png) in --output_dir, uploaded by "
            "push_to_hub; read it with hf_selective_backprop.record (data map, label issues, pruning)."
        },
    )
    sb_subset_from: str | None = field(
        default=None,
        metadata={
            "help": "Train on a subset chosen by an earlier run's example record: its output folder, its "
            "example_record.parquet, or the Hub repository it was pushed to. With --sb_subset_keep and "
            "--sb_subset_by. (Unrelated to 'infobatch', which prunes anew each epoch.) Default: the whole set."
        },
    )
    sb_subset_keep: float | None = field(
        default=None,
        metadata={"help": "With --sb_subset_from: the share of the training set kept, in (0, 1]."},
    )
    sb_subset_by: str = field(
        default="variability",
        metadata={
            "help": "With --sb_subset_from: the record's score that keeps the examples with its highest values: "
            + "; ".join(f"'{name}': {what}" for name, what in PRUNE_SCORES.items()) + ".",
            "choices": list(PRUNE_SCORES),
        },
    )

    def __post_init__(self):
        # The training arguments' own checks first: the sb checks read their fields (batch sizes, max_steps).
        base_post_init = getattr(super(), "__post_init__", None)
        if base_post_init is not None:
            base_post_init()
        self._validate_sb()

    def _validate_sb(self) -> None:
        check_selective_arguments(self)

    @property
    def sb_keep_fraction(self) -> float:
        """The kept fraction asked for, reconciling sb_keep, sb_beta and sb_presample."""
        if self.sb_keep is not None:
            return self.sb_keep
        if self.sb_strategy in ("sb", "rholoss") and self.sb_beta is not None:
            return 1.0 / (self.sb_beta + 1.0)
        if self.sb_strategy == "kath18" and self.sb_presample is not None:
            return 1.0 / self.sb_presample
        return DEFAULT_KEEP

    @property
    def sb_beta_value(self) -> float:
        """beta of 'sb': given, or 1/keep - 1."""
        return self.sb_beta if self.sb_beta is not None else 1.0 / self.sb_keep_fraction - 1.0

    def selection_batch_size(self, train_batch_size: int) -> int:
        """Rows of one selection batch per device: given, or the training batch ('kath18': presample x it)."""
        if self.sb_selection_batch_size is not None:
            return self.sb_selection_batch_size
        if self.sb_strategy == "kath18":
            return math.ceil(self.sb_presample_value * train_batch_size)
        return train_batch_size

    @property
    def sb_presample_value(self) -> float:
        """Presampling factor of 'kath18': given, or 1/keep."""
        return self.sb_presample if self.sb_presample is not None else 1.0 / self.sb_keep_fraction


@dataclass
class SelectiveBackpropConfig(SelectiveBackpropArguments, TrainingArguments):
    """Training arguments for `SelectiveBackpropTrainer`: `TrainingArguments` plus the `sb_*` flags."""


#: TRL's trainers whose batches hold one example per row, as selection needs; the rest of TRL's are refused.
SUPPORTED_TRL_TRAINERS = ("SFTTrainer", "_BaseTrainer")


def selective_arguments(args: tuple, kwargs: dict) -> SelectiveBackpropArguments | None:
    """The `SelectiveBackpropArguments` among a trainer's constructor arguments, if any."""
    given = kwargs.get("args", next((a for a in args if isinstance(a, SelectiveBackpropArguments)), None))
    return given if isinstance(given, SelectiveBackpropArguments) else None


def refuse_unsupported_trainer(trainer_class: type, given: SelectiveBackpropArguments | None) -> None:
    """The mixin on one of TRL's preference or online trainers, refused before that trainer prepares its data.

    Their examples are not rows with a loss of their own: DPO, CPO, ORPO and reward modelling batch each
    example as a chosen and a rejected sequence (concatenated rows whose loss is defined only together, DPO's
    also against a reference model), KTO's loss is relative to a batch-level reference point, and GRPO, RLOO
    and online DPO generate their completions inside the step. A per-pair loss is well defined for the paired
    ones, but keeping or dropping pairs would need the queue to keep two rows together and the selection
    forward to run the trainer's own pair loss; neither is built.
    """
    if getattr(given, "sb_strategy", "none") == "none":
        return
    unsupported = next((cls for cls in trainer_class.__mro__ if cls.__module__.split(".")[0] == "trl"
                        and cls.__name__ not in SUPPORTED_TRL_TRAINERS), None)
    if unsupported is not None:
        raise CannotSelect(
            f"selection (--sb_strategy {given.sb_strategy}) on TRL's {unsupported.__name__} is not supported: its "
            "batches hold paired (chosen/rejected) sequences or completions generated in the step, not examples "
            "with a loss of their own that selection could keep or drop one by one. Supported: transformers' "
            "Trainer and Seq2SeqTrainer, and TRL's SFTTrainer; or train with --sb_strategy none"
        )


def check_trainer_arguments(trainer, per_example_loss_func) -> None:
    """What a selective trainer refuses among its own arguments, before it builds anything."""
    if not isinstance(trainer.args, SelectiveBackpropArguments):
        raise TypeError(
            f"{type(trainer).__name__} needs args with the sb_* fields of SelectiveBackpropArguments (e.g. "
            f"{trainer.config_class_name}), got {type(trainer.args).__name__}"
        )
    if trainer.compute_loss_func is not None and per_example_loss_func is None and trainer.args.sb_strategy != "none":
        raise CannotSelect(
            "compute_loss_func is set, so selection cannot know each example's loss: pass "
            "per_example_loss_func=(outputs, labels) -> per-example losses as well"
        )
