"""Selective-Backprop for the Hugging Face Trainer (Jiang et al., arXiv 1910.00762)."""

from __future__ import annotations

import importlib

__all__ = ["SelectiveBackpropConfig", "SelectiveBackpropTrainer"]
__version__ = "0.1.0"

# Importing transformers' Trainer takes seconds; the pure pieces (selectors, history, store,
# queue) should not pay for it, so the public classes load on first use.
_LAZY = {"SelectiveBackpropConfig": ".config", "SelectiveBackpropTrainer": ".trainer"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
