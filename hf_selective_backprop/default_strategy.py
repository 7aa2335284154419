"""The strategy a user did not choose, told apart from one chosen.

`SelectiveBackpropConfig()` as it comes selects with InfoBatch. Where selection cannot run on a setup that `Trainer`
trains (a trainer, model, dataset or launch it does not support), the default steps aside: one warning names why,
and the run trains as ``--sb_strategy none``, the Trainer's own loop. A strategy named on purpose, ``infobatch``
included, is refused there instead, with the same reason.
"""

from __future__ import annotations

import warnings


class DefaultChoice(str):
    """A default that compares, hashes, prints and serializes as its plain string but remembers that nobody gave it:
    ``--sb_strategy infobatch`` typed or passed is a plain ``str``. argparse converts a string default with the
    flag's type (``str(default)``), so ``__str__`` keeps the mark."""

    __slots__ = ()

    def __str__(self) -> str:
        return self

    def __reduce__(self):
        return DefaultChoice, (str.__str__(self),)


class CannotSelect(ValueError):
    """Selection refused on this setup (its trainer, model, data or launch), not for a bad value: the default
    strategy steps aside on it, a chosen one is refused with it."""


class StrategySteppedAside(UserWarning):
    """The default strategy could not run on this setup, and the run trains as ``--sb_strategy none``."""


DEFAULT_STRATEGY = DefaultChoice("infobatch")


def is_default(args) -> bool:
    """Whether ``args.sb_strategy`` is the default, not chosen."""
    return isinstance(getattr(args, "sb_strategy", None), DefaultChoice)


def step_aside(args, reason: str) -> None:
    """Train as ``--sb_strategy none``, saying why once."""
    warnings.warn(
        f"the default strategy (--sb_strategy {args.sb_strategy}) cannot run on this setup and steps aside: {reason}. "
        "Training every example, as Trainer does (--sb_strategy none); name a strategy with --sb_strategy to have "
        "such a setup refused instead",
        StrategySteppedAside, stacklevel=3,
    )
    args.sb_strategy = "none"
