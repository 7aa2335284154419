"""Selective-Backprop for the Hugging Face Trainer (Jiang et al., arXiv 1910.00762)."""

from .config import SelectiveBackpropConfig
from .trainer import SelectiveBackpropTrainer

__all__ = ["SelectiveBackpropConfig", "SelectiveBackpropTrainer"]
__version__ = "0.1.0"
