"""The settings a model card publishes: the strategy and the ``sb_*`` settings given other values than their
defaults, with a local path by its last component only (``push_to_hub`` publishes the card)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path


def sb_settings(args: object) -> dict[str, object]:
    """Every ``sb_*`` setting of ``args``, by name: new options appear without code changes."""
    names = sorted(name for name in dir(args) if name.startswith("sb_"))
    settings = {name: getattr(args, name) for name in names}
    return {name: value for name, value in settings.items() if not callable(value)}


def applied_settings(args: object) -> dict[str, object]:
    """The strategy and the ``sb_*`` settings that differ from their defaults, as the card publishes them: a local
    path (``--sb_subset_from``, ``--sb_reference_model``) by its last component, never the machine's path."""
    settings = sb_settings(args)
    if dataclasses.is_dataclass(args):  # fields only: properties derived from them (sb_keep_fraction) are not
        defaults = {field.name: field.default for field in dataclasses.fields(args)}
        settings = {name: value for name, value in settings.items()
                    if name in defaults and (name == "sb_strategy" or value != defaults[name])}
    return {name: _without_local_path(value) for name, value in settings.items()}


def _without_local_path(value: object) -> object:
    if isinstance(value, str | os.PathLike) and (os.path.isabs(value) or os.path.exists(value)):
        return Path(value).name
    return value


def reference_model_source(args) -> str | None:
    """What gave a 'rholoss' run its irreducible losses, for the card."""
    if getattr(args, "sb_strategy", None) != "rholoss":
        return None
    if args.sb_reference_model is not None:
        return f"`{_without_local_path(args.sb_reference_model)}`"
    if args.sb_reference_column is not None:
        return f"column `{args.sb_reference_column}` of the training data"
    return "a reference model passed to the trainer"
