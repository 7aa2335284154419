"""A compute budget (``--sb_budget``): what the configured full run costs, the plan that meets a share of it
(made before training, or kept from the checkpoint a run resumes), the Trainer's loop values that follow from
it, and the cost a run has spent.

Cost is counted in examples' training steps (a forward and a backward), summed over processes, as the
paper's cost model counts it (Jiang et al., 2019, section 3): one per backward pass, and ``phi`` per
selection forward and per example of the 'rholoss' reference pass. The configured full run is plain
training (every example read is trained) for ``num_train_epochs`` of the data, or for ``max_steps``
optimizer steps; the budget is ``sb_budget`` times its cost.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch
from transformers.trainer_utils import has_length

from .. import _compat
from . import distributed
from .checkpoints import STATE_FILE
from .run_length import RunLength

#: What a backward and the optimizer step cost per training forward in the cost model (r = 2: a backward
#: costs two forwards, the paper's assumption).
COST_MODEL_R = 2.0
#: phi until the engine has measured it (--sb_cost_phi not given): a selection forward costs one training
#: forward, a third of a training step (1 / (1 + r)).
DEFAULT_PHI = 1.0 / (1.0 + COST_MODEL_R)

#: Where a plan's phi comes from: --sb_cost_phi; the cost model's, while the engine measures it on the run's first
#: steps (phi_meter); measured; the cost model's for good, in a run that has no selection forward to time.
PHI_GIVEN, PHI_MEASURING, PHI_MEASURED, PHI_COST_MODEL = "sb_cost_phi", "measuring", "measured", "cost model"
#: What a run that ended while phi was measured reports: it was priced at the cost model's phi.
PHI_NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class BudgetPlan:
    """A budget run's plan, made once before training and kept in checkpoints, so a resumed run ends where
    the uninterrupted one does. Costs are in examples' training steps over all processes.

    ``before_training`` is what was spent before the first step (the reference pass); ``epochs`` and
    ``steps`` are what the strategy is expected to read and take within the budget (``epochs`` is None for
    a stream, whose epoch length is unknown). ``phi_source`` says where ``phi`` comes from (``PHI_*``); while it
    is measured, the plan is the cost model's and is made anew from the measured phi, but for ``steps``: the
    learning-rate schedule was built over them (it spans the run by the share of the budget spent).
    """

    budget: float
    phi: float
    full_cost: float
    before_training: float
    epochs: float | None
    steps: int
    phi_source: str = PHI_GIVEN  # what plans saved before phi was measured had: a fixed phi

    @property
    def target(self) -> float:
        return self.budget * self.full_cost

    def spent(self, backwards: float, selection_forwards: float, reference_forwards: float) -> float:
        return backwards + self.phi * (selection_forwards + reference_forwards)

    def progress(self, spent: float) -> float:
        """The share of the budget's training cost (past the reference pass) spent."""
        return min(max(spent - self.before_training, 0.0) / (self.target - self.before_training), 1.0)

    def loop_values(self, values):
        """The Trainer's loop values (``_compat.TrainingValues``) for this plan: its steps, and epochs without
        bound, since the run ends when its budget is spent."""
        return values._replace(num_train_epochs=sys.maxsize, max_steps=self.steps)

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict) -> BudgetPlan:
        return cls(**state)


def refuse_unsized(args, dataset) -> None:
    """A budget is a share of a run of known cost: a stream (no length) without --max_steps has none."""
    if getattr(args, "sb_budget", None) is None or args.max_steps > 0:
        return
    if dataset is not None and not has_length(dataset):
        raise ValueError(
            f"--sb_budget {args.sb_budget} is a share of the full run's cost, which a training dataset without a "
            "length (a stream) and no --max_steps leaves unknown: set --max_steps (the full run) as well"
        )


class PlainBudget:
    """``--sb_budget F`` without selection (``--sb_strategy none``): F of the full run's optimizer steps (rounded),
    over which the Trainer's schedule runs. A plain run's cost is its steps."""

    def __init__(self, budget: float):
        self.budget = budget
        self.full_steps = 0  # the full run's, once the Trainer has sized it

    def loop_values(self, values):
        """The Trainer's loop values for the full run, cut to the budget's steps."""
        values = _compat.training_values(values)
        self.full_steps = values.max_steps
        steps = round(self.budget * self.full_steps)
        if steps < 1:
            raise ValueError(
                f"--sb_budget {self.budget:g} buys less than one optimizer step of this run: "
                f"{self.budget * self.full_steps:.3g} of the full run's {self.full_steps}; raise --sb_budget to at "
                f"least {_rounded_up(1 / self.full_steps):.3g}"
            )
        return values._replace(max_steps=steps)

    def spent(self, global_step: int) -> float:
        """The share of the full run's cost spent after ``global_step`` optimizer steps."""
        return global_step / self.full_steps


def saved_plan(checkpoint: str | None) -> BudgetPlan | None:
    """The budget plan ``checkpoint`` was saved with, if any: a resumed run sizes its schedule from it (the
    reference pass it paid for is not scored again, and another number of processes would size it anew)."""
    path = os.path.join(checkpoint, STATE_FILE) if checkpoint else ""
    if not os.path.isfile(path):
        return None
    saved = torch.load(path, weights_only=True).get("budget")
    return None if saved is None else BudgetPlan.from_state_dict(saved)


def loop_values(engine, args, run_length: RunLength, values, dataloader, checkpoint: str | None):
    """The Trainer's loop values (``_compat.TrainingValues``) for a selective run, and how ``engine``'s run ends:
    when its data does (epoch-based), after its steps, or when its budget is spent (the plan of `run_plan`)."""
    epoch_based = has_length(dataloader) and args.max_steps <= 0
    made, replan = run_plan(args, run_length, engine.selector, engine.accelerator, epoch_based, checkpoint,
                            engine.stats.reference_forwards)
    engine.set_run_length(epoch_based, made, replan)
    if has_length(dataloader) and not epoch_based and made is None:
        engine.selector.fit_run(step_based_epochs(args, run_length))
    if has_length(dataloader):  # a stream keeps the Trainer's values: it is step-based
        values = run_length.loop_values(values, args, engine.epoch_based)
    return values if made is None else made.loop_values(values)


def step_based_epochs(args, run_length: RunLength) -> int:
    """The epochs a --max_steps run on a map-style dataset counts, as the Trainer derives them: max_steps over the
    full data's optimizer steps per epoch, rounded up. Strategies that decide by epochs (InfoBatch's annealing, early
    pruning) count in these; pruned epochs are shorter, so the run reads more epochs than that before max_steps, and
    annealing starts a little before anneal_delta x max_steps."""
    steps_per_epoch = max(1, math.ceil(run_length.rows_per_epoch / run_length.rows_per_step))
    return math.ceil(args.max_steps / steps_per_epoch)


def run_plan(args, run_length: RunLength, selector, accelerator, epoch_based: bool, checkpoint: str | None,
             reference_forwards: float) -> tuple[BudgetPlan | None, Callable[[float], BudgetPlan] | None]:
    """A selective run's budget plan (None without --sb_budget), and what makes it anew from a measured phi.

    A resumed run keeps the plan ``checkpoint`` holds; a new one is planned after its reference pass of
    ``reference_forwards`` examples on this process ('rholoss'; summed over processes: a collective).
    """
    if args.sb_budget is None:
        return None, None
    saved = saved_plan(checkpoint)
    if saved is None:
        scored = distributed.sum_over_processes(accelerator, {"rows": reference_forwards})["rows"]
    else:
        scored = saved.before_training / saved.phi  # the reference pass the saved plan paid for
    # The plan for a phi measured on the first steps (--sb_cost_phi not given): made anew then.
    replan = partial(plan, args, run_length, selector, accelerator.num_processes, epoch_based, scored)
    return saved or replan(), replan


def plan(args, run_length: RunLength, selector, num_processes: int, epoch_based: bool,
         reference_forwards: float, measured_phi: float | None = None) -> BudgetPlan:
    """The epochs (and optimizer steps) whose expected cost meets the budget, for ``selector``'s strategy, after
    a reference pass of ``reference_forwards`` examples (over all processes).

    Per row read after warm-up, a strategy trains ``run_length.expected_keep()`` rows (the kept fraction,
    diluted by the plain steps outside --sb_start/--sb_end and of --sb_interrupt) and scores a share of them:
    all for a strategy with a selection forward (1/n of the epochs with --sb_staleness n), none for one that
    decides without (uniform, InfoBatch). Warm-up epochs train every row and score none.

    phi is ``measured_phi``, else --sb_cost_phi, else the cost model's until the engine measures it (in a run
    with selection forwards: in others phi prices nothing).
    """
    if measured_phi is not None:
        phi, source = measured_phi, PHI_MEASURED
    elif args.sb_cost_phi is not None:
        phi, source = args.sb_cost_phi, PHI_GIVEN
    else:
        phi, source = DEFAULT_PHI, PHI_MEASURING if selector.needs_losses else PHI_COST_MODEL
    rows_per_step = run_length.rows_per_step * num_processes
    rows_per_epoch = run_length.rows_per_epoch * num_processes
    full_cost = args.num_train_epochs * rows_per_epoch if epoch_based else args.max_steps * rows_per_step
    budget = args.sb_budget
    before_training = phi * reference_forwards
    training = budget * full_cost - before_training
    if not training > 0:
        raise ValueError(
            f"--sb_budget {budget}: the reference pass alone costs {before_training:.0f} of the budget's "
            f"{budget * full_cost:.0f} (examples' training steps): raise --sb_budget"
        )
    scored = (1.0 if selector.needs_losses else 0.0) / args.sb_staleness
    active = run_length.active_share
    # The cost of one trained row after warm-up: its step, and the selection forwards of the rows read for it.
    per_trained = 1.0 + phi * active * scored / run_length.keep
    warm_rows = args.sb_warmup_epochs * rows_per_epoch  # a stream (no epoch length) has no warm-up to plan
    warm = min(training, warm_rows)
    trained = warm + (training - warm) / per_trained
    if measured_phi is None:  # the plan made before training (a measured phi re-prices a running one)
        _check_what_it_buys(args, trained, rows_per_step, training <= warm_rows, training / max(rows_per_epoch, 1),
                            (before_training + _cost_of_rows(rows_per_step, warm_rows, per_trained)) / full_cost)
    steps = max(1, math.floor(trained / rows_per_step))
    epochs = None
    if rows_per_epoch:
        epochs = warm / rows_per_epoch + (training - warm) / (rows_per_epoch * run_length.expected_keep() * per_trained)
    return BudgetPlan(budget, phi, float(full_cost), float(before_training), epochs, steps, source)


def _cost_of_rows(rows: float, warm_rows: float, per_trained: float) -> float:
    """What training ``rows`` rows costs: one each during warm-up, ``per_trained`` each after it."""
    return min(rows, warm_rows) + max(rows - warm_rows, 0.0) * per_trained


def _check_what_it_buys(args, trained: float, rows_per_step: int, all_warm: bool, epochs: float,
                        least_budget: float) -> None:
    """Refuse a budget that buys less than one optimizer step (the run would take one, many times over it); say
    so when all it buys is warm-up (selection would never start)."""
    if trained < rows_per_step:
        raise ValueError(
            f"--sb_budget {args.sb_budget:g} buys less than one optimizer step of this run: about {trained:.3g} "
            f"trained examples (over all processes), where a step trains {rows_per_step}; raise --sb_budget to at "
            f"least {_rounded_up(least_budget):.3g}"
        )
    if args.sb_warmup_epochs and all_warm:
        warnings.warn(
            f"--sb_budget {args.sb_budget:g} buys about {epochs:.1f} epochs of training, all within "
            f"--sb_warmup_epochs {args.sb_warmup_epochs}: every example read is trained and --sb_strategy "
            f"{args.sb_strategy} never selects (as --sb_strategy none would train with this budget); lower "
            "--sb_warmup_epochs, or raise --sb_budget",
            stacklevel=4,
        )


def _rounded_up(value: float, digits: int = 3) -> float:
    """``value`` rounded up to ``digits`` significant digits: a least value that, printed, is not below it."""
    scale = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return math.ceil(value / scale) * scale
