"""The selection engine: what selection holds between steps, and how it saves and restores it."""

from .engine import WEIGHT_KEY, SelectionEngine
from .epoch_plan import EpochPlan, PlannedSampler

__all__ = ["WEIGHT_KEY", "EpochPlan", "PlannedSampler", "SelectionEngine"]
