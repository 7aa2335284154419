"""Step decay at fixed shares of a run, on top of any of the Trainer's `LambdaLR` schedules.

The Selective-Backprop paper trains CIFAR-10 with lr 0.1 divided by 5 at epochs 60, 120 and 160
of 200 (Jiang et al., 2019, section 5.1): ``--lr_scheduler_type constant --lr_decay_milestones 0.3
0.6 0.8 --lr_decay_factor 0.2``. A milestone is a share of the run's optimizer steps; under
selection the trainer maps data read to steps (see `SelectiveBackpropMixin.create_scheduler`), so
the decays fall on the same epochs whatever a strategy keeps, as the paper's do.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from functools import partial

from . import _compat

#: The paper's epochs 60/120/160 of 200.
PAPER_MILESTONES = (0.3, 0.6, 0.8)
PAPER_FACTOR = 0.2


def _decayed(fn: Callable[[int], float], milestones: tuple[float, ...], factor: float, total_steps: int,
             step: int) -> float:
    # Compared as step / total, like the selection window, so 0.3 of 10 steps decays exactly at step 3.
    return fn(step) * factor ** bisect_right(milestones, step / total_steps)


def step_decay(
    fn: Callable[[int], float], milestones: Sequence[float], factor: float, total_steps: int
) -> Callable[[int], float]:
    """``fn`` multiplied by ``factor`` once for every milestone that ``step / total_steps`` has reached.

    A `functools.partial`, like transformers' own lambdas: `LambdaLR.state_dict` saves a callable
    object's ``__dict__``, which a partial keeps empty, so checkpoints hold no functions.
    """
    check_milestones(milestones, factor)
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    return partial(_decayed, fn, tuple(float(m) for m in milestones), float(factor), int(total_steps))


def is_step_decay(fn: Callable) -> bool:
    return isinstance(fn, partial) and fn.func is _decayed


def check_milestones(milestones: Sequence[float], factor: float) -> None:
    values = list(milestones)
    # Written so that NaN fails too.
    increasing = all(b > a for a, b in zip(values[:-1], values[1:], strict=True))
    if not values or not all(0.0 < m < 1.0 for m in values) or not increasing:
        raise ValueError(
            f"--lr_decay_milestones must be increasing shares of the run, each in (0, 1), got {values!r}"
        )
    if not 0.0 < factor <= 1.0:
        raise ValueError(f"--lr_decay_factor must be in (0, 1], got {factor!r}")


def at_progress(fn: Callable[[int], float], trainer, total_steps: int, step: int) -> float:
    """``fn`` at the step that a selective run's progress (the share of its data read, or of its budget spent) makes
    of ``total_steps``: how many examples selection keeps drifts as losses fall, so an epoch's step count (and a
    budget's) is only known afterwards."""
    if not (trainer.is_in_train and trainer.engine.follows_progress):
        return fn(step)  # a step-based run, or a scheduler stepped by hand outside training
    progress = trainer.training_progress()
    if progress >= 1.0:
        return fn(total_steps)
    # The schedule's end belongs to the run's last step: a run that outlives the steps it was sized to (it kept
    # more rows, or its budget bought more steps than the cost model's phi said) would otherwise take its last
    # steps at that end (a linear decay's zero).
    return fn(min(round(progress * total_steps), total_steps - 1))


def schedule_for(trainer, scheduler, total_steps: int) -> None:
    """The Trainer's ``LambdaLR`` schedule with ``--lr_decay_milestones``, and under selection on the run's
    progress (`at_progress`)."""
    milestones = getattr(trainer.args, "lr_decay_milestones", None)
    if milestones:
        # Inside the progress mapping below, so the decays fall on shares of the data read.
        factor = trainer.args.lr_decay_factor
        _compat.map_lr_lambdas(
            scheduler, lambda fn: fn if is_step_decay(fn) else step_decay(fn, milestones, factor, total_steps)
        )
    if trainer.selector is not None:
        _compat.map_lr_lambdas(scheduler, lambda fn: partial(at_progress, fn, trainer, total_steps))
