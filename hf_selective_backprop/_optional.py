"""The workflows' optional dependencies: imported where a workflow needs them, with the extra that installs them.

The trainer, engine, selectors, losses and cards need none of these (pyproject.toml, docs/architecture.md
"What ships"); the bundled workflows do: image models and decoding (``vision``), the accuracy metric
(``metrics``), the benchmark harness's plots (``benchmarks``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: top-level module -> (the distribution that provides it, the extra that installs it)
OPTIONAL = {
    "timm": ("timm", "vision"),
    "torchvision": ("torchvision", "vision"),
    "PIL": ("pillow", "vision"),
    "sklearn": ("scikit-learn", "vision"),
    "evaluate": ("evaluate", "metrics"),
    "matplotlib": ("matplotlib", "benchmarks"),
}


def require(module: str, needed_by: str) -> ModuleType:
    """Import ``module``; if it cannot be imported, an ImportError that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        distribution, extra = OPTIONAL[module.split(".")[0]]
        raise ImportError(
            f"{needed_by} needs {distribution}, which could not be imported ({error}): "
            f"pip install 'hf-selective-backprop[{extra}]'"
        ) from error
