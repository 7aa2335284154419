"""Selection strategies: per-example losses in, rows to train on out."""

from .base import Selection, Selector
from .composer import ComposerSelector
from .kath18 import Kath18Selector
from .percentile import PercentileSelector
from .reweighted import ReweightedPercentileSelector
from .topk import TopKSelector, keep_count
from .uniform import UniformSelector

__all__ = [
    "ComposerSelector",
    "Kath18Selector",
    "PercentileSelector",
    "ReweightedPercentileSelector",
    "Selection",
    "Selector",
    "TopKSelector",
    "UniformSelector",
    "build_selector",
    "keep_count",
]


def build_selector(args) -> Selector | None:
    """The selector that ``args.sb_strategy`` names (None for 'none').

    ``args`` is a `SelectiveBackpropConfig` (or anything with the same ``sb_*`` attributes).
    """
    strategy = args.sb_strategy
    if strategy == "none":
        return None
    if strategy == "sb":
        cls = ReweightedPercentileSelector if args.sb_importance_weighting else PercentileSelector
        return cls(args.sb_beta_value, args.sb_history_size, args.sb_min_prob)
    if strategy == "topk":
        return TopKSelector(args.sb_keep_fraction)
    if strategy == "composer":
        return ComposerSelector(args.sb_keep_fraction)
    if strategy == "uniform":
        return UniformSelector(args.sb_keep_fraction)
    if strategy == "kath18":
        return Kath18Selector(
            args.sb_presample_value,
            args.sb_importance_weighting,
            args.sb_variance_start,
            args.per_device_train_batch_size,
        )
    raise ValueError(f"--sb_strategy {strategy!r} is not implemented")
