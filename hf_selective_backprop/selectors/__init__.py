"""Selection strategies: per-example losses in, rows to train on out.

Each built-in strategy is registered under its ``--sb_strategy`` name; `register_strategy` adds
one defined elsewhere (see docs/architecture.md).
"""

from .base import Selection, Selector
from .composer import ComposerSelector
from .early_prune import EarlyPruneSelector
from .infobatch import INFOBATCH_ANNEAL_DELTA, InfoBatchSelector
from .kath18 import Kath18Selector
from .percentile import PercentileSelector
from .registry import build_selector, register_strategy, strategy_names
from .reweighted import ReweightedPercentileSelector
from .rholoss import RhoLossCDFSelector, RhoLossSelector
from .topk import TopKSelector, keep_count
from .uniform import UniformSelector

__all__ = [
    "ComposerSelector",
    "EarlyPruneSelector",
    "InfoBatchSelector",
    "Kath18Selector",
    "PercentileSelector",
    "ReweightedPercentileSelector",
    "RhoLossCDFSelector",
    "RhoLossSelector",
    "Selection",
    "Selector",
    "TopKSelector",
    "UniformSelector",
    "build_selector",
    "keep_count",
    "register_strategy",
    "strategy_names",
]


@register_strategy("sb")
def _sb(args) -> Selector:
    cls = ReweightedPercentileSelector if args.sb_importance_weighting else PercentileSelector
    return cls(args.sb_beta_value, args.sb_history_size, args.sb_min_prob)


register_strategy("topk", lambda args: TopKSelector(args.sb_keep_fraction))
register_strategy("composer", lambda args: ComposerSelector(args.sb_keep_fraction))
register_strategy("uniform", lambda args: UniformSelector(args.sb_keep_fraction))
register_strategy(
    "kath18",
    lambda args: Kath18Selector(
        args.sb_presample_value, args.sb_importance_weighting, args.sb_variance_start, args.per_device_train_batch_size
    ),
)


def _early_prune(by: str):
    # Warm-up epochs (--sb_warmup_epochs) train everything already; without them the first epoch does.
    return lambda args: EarlyPruneSelector(
        args.sb_keep_fraction, by, args.num_train_epochs, full_epochs=0 if args.sb_warmup_epochs else 1,
        anneal_delta=1.0 if args.sb_anneal_delta is None else args.sb_anneal_delta,
    )


register_strategy("early_prune", _early_prune("loss"))
register_strategy("early_coverage", _early_prune("coverage"))
register_strategy("early_random", _early_prune("random"))
register_strategy("early_class_budget", _early_prune("class_budget"))
register_strategy(
    "infobatch",
    lambda args: InfoBatchSelector(
        args.sb_prune_ratio,
        INFOBATCH_ANNEAL_DELTA if args.sb_anneal_delta is None else args.sb_anneal_delta,
        args.num_train_epochs,
    ),
)


@register_strategy("rholoss")
def _rholoss(args) -> Selector:
    if args.sb_rho_rule == "cdf":
        return RhoLossCDFSelector(args.sb_beta_value, args.sb_history_size, args.sb_min_prob)
    return RhoLossSelector(args.sb_keep_fraction)
