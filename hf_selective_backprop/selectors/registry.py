"""Strategies by name: what ``--sb_strategy`` looks up, open to strategies defined outside the package."""

from __future__ import annotations

from collections.abc import Callable

from .base import Selector

#: ``--sb_strategy`` name -> factory building the strategy from the training arguments.
_FACTORIES: dict[str, Callable[[object], Selector]] = {}

#: The strategy name that turns selection off (plain Trainer).
NO_SELECTION = "none"


def register_strategy(name: str, factory: Callable[[object], Selector] | None = None):
    """Make ``--sb_strategy name`` build ``factory(args)``; usable as a decorator.

    ``args`` is the `SelectiveBackpropConfig`, so a factory can read any flag (``args.sb_keep_fraction``,
    ``args.per_device_train_batch_size``...). Register before the config is built: its validation checks
    the name against this registry.
    """

    def add(factory):
        if name == NO_SELECTION or not name:
            raise ValueError(f"{name!r} cannot name a strategy")
        _FACTORIES[name] = factory
        return factory

    return add if factory is None else add(factory)


def strategy_names() -> tuple[str, ...]:
    """Every valid ``--sb_strategy`` value, 'none' first."""
    return (NO_SELECTION, *_FACTORIES)


def build_selector(args) -> Selector | None:
    """The strategy ``args.sb_strategy`` names, or None for 'none'."""
    if args.sb_strategy == NO_SELECTION:
        return None
    if args.sb_strategy not in _FACTORIES:
        raise ValueError(f"--sb_strategy must be one of {', '.join(strategy_names())}, got {args.sb_strategy!r}")
    return _FACTORIES[args.sb_strategy](args)
