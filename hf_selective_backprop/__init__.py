"""Selective-Backprop for the Hugging Face Trainer (Jiang et al., arXiv 1910.00762)."""

from __future__ import annotations

import importlib
import importlib.util

__all__ = [
    "SelectiveBackpropArguments",
    "SelectiveBackpropConfig",
    "SelectiveBackpropMixin",
    "SelectiveBackpropSeq2SeqConfig",
    "SelectiveBackpropSeq2SeqTrainer",
    "SelectiveBackpropTrainer",
]
_TRL_NAMES = ["SelectiveBackpropSFTConfig", "SelectiveBackpropSFTTrainer"]
if importlib.util.find_spec("trl") is not None:
    __all__ += _TRL_NAMES
# The one version string: pyproject.toml reads it ([tool.setuptools.dynamic]).
__version__ = "0.1.0"

# Importing transformers' Trainer takes seconds; the pure pieces (selectors, history, store,
# queue) should not pay for it, so the public classes load on first use.
# The TRL pair loads only where trl is installed (the "trl" extra).
_LAZY = {
    "SelectiveBackpropArguments": ".config",
    "SelectiveBackpropConfig": ".config",
    "SelectiveBackpropMixin": ".trainer",
    "SelectiveBackpropTrainer": ".trainer",
    "SelectiveBackpropSeq2SeqConfig": ".seq2seq",
    "SelectiveBackpropSeq2SeqTrainer": ".seq2seq",
    "SelectiveBackpropSFTConfig": ".sft",
    "SelectiveBackpropSFTTrainer": ".sft",
}


# The one eager import: the package's own timm networks (cifar_nets.py) are registered in timm wherever timm is
# installed, so that a model saved from one reloads with from_pretrained in any process that imported the package.
# After transformers' Trainer, which loads torchvision too, timm's import adds a fraction of a second.
if importlib.util.find_spec("timm") is not None:
    try:
        from . import cifar_nets  # noqa: F401
    except ImportError:  # a timm that cannot be imported: the workflows that need it say so; the library needs none
        pass


def __getattr__(name: str):
    if name in _TRL_NAMES and importlib.util.find_spec("trl") is None:
        raise ImportError(f"{name} needs TRL: pip install 'hf-selective-backprop[trl]'")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
