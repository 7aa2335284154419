"""The strategies a benchmark compares, as `SelectiveBackpropConfig` overrides."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_STRATEGIES = ("traditional", "sb", "stale-sb", "kath18", "composer", "uniform")

#: SB-family settings that end on all data: name -> (label, overrides besides sb, keep and sb_end 0.875).
ANNEALED = {
    "sb-anneal": ("SB keep {keep:.2f}, annealed", {}),
    "sb-anneal-floor": ("SB keep {keep:.2f}, floor 0.1, annealed", {"sb_min_prob": 0.1}),
    "sb-anneal-weighted": ("SB keep {keep:.2f}, reweighted, annealed", {"sb_importance_weighting": True}),
    "stale-sb-anneal": ("Stale-SB (n={n}) keep {keep:.2f}, annealed", {"sb_staleness": None}),
}

#: RHO-LOSS strategies: name -> (--sb_rho_rule, label, stale). A stale one scores reducible losses from the
#: selection pass of every n-th epoch (n = --staleness), as Stale-SB does, so most epochs skip that forward.
RHO_RULES = {
    "rholoss": ("topk", "RHO-LOSS", False),
    "rholoss-cdf": ("cdf", "RHO-LOSS, SB's CDF rule", False),
    "stale-rholoss": ("topk", "Stale RHO-LOSS (n={n})", True),
}


@dataclass(frozen=True)
class Strategy:
    name: str
    label: str
    overrides: dict = field(default_factory=dict)

    @property
    def cycle(self) -> int:
        """Epochs after which the per-epoch cost repeats (Stale-SB: n)."""
        return int(self.overrides.get("sb_staleness", 1))


def build_strategy(
    name: str, keep: float, staleness: int, warmup_epochs: int, reference_model: str | None = None
) -> Strategy:
    """`name` is one of traditional, sb, stale-sb, kath18, composer, uniform, topk, sb-warmup, sb-train-mode, rholoss,
    rholoss-cdf, stale-rholoss; the last three score with ``reference_model`` (a folder scripts/train.py wrote)."""
    if name == "traditional":
        return Strategy(name, "Traditional", {"sb_strategy": "none"})
    base, keyword, value = name.rpartition("-keep")
    if keyword and base and not name.startswith("uniform-for-"):
        # <strategy>-keep<k>: that strategy at another kept fraction than --keep (e.g. sb-keep0.5 beside sb).
        try:
            fraction = float(value)
        except ValueError as error:
            raise ValueError(
                f"strategy {name!r}: the kept fraction after -keep must be a number, got {value!r}"
            ) from error
        strategy = build_strategy(base, fraction, staleness, warmup_epochs, reference_model)
        if "sb_keep" not in strategy.overrides:
            raise ValueError(f"strategy {name!r}: {base} has no kept fraction to set")
        return Strategy(name, f"{strategy.label}, keep {fraction:g}", strategy.overrides)
    if name == "sb":
        return Strategy(name, "SB", {"sb_strategy": "sb", "sb_keep": keep})
    if name == "stale-sb":
        return Strategy(
            name, f"Stale-SB (n={staleness})", {"sb_strategy": "sb", "sb_keep": keep, "sb_staleness": staleness}
        )
    if name == "sb-warmup":
        return Strategy(
            name,
            f"SB after {warmup_epochs} full epoch{'' if warmup_epochs == 1 else 's'}",
            {"sb_strategy": "sb", "sb_keep": keep, "sb_warmup_epochs": warmup_epochs},
        )
    if name == "sb-train-mode":
        # The selection forward in train mode: BatchNorm normalises each selection batch by its own statistics and
        # its running statistics follow every example read, not only the kept (hard) ones the training forwards see.
        overrides = {"sb_strategy": "sb", "sb_keep": keep, "sb_selection_mode": "train"}
        return Strategy(name, "SB, selection forward in train mode", overrides)
    if name == "infobatch":
        return Strategy(name, "InfoBatch", {"sb_strategy": "infobatch"})
    if name.startswith("infobatch-r"):  # e.g. infobatch-r0.7: another prune ratio
        ratio = float(name.removeprefix("infobatch-r"))
        return Strategy(name, f"InfoBatch r={ratio:g}", {"sb_strategy": "infobatch", "sb_prune_ratio": ratio})
    if name in ANNEALED:
        # The last 12.5 % of training on all data, as InfoBatch anneals.
        overrides = {"sb_strategy": "sb", "sb_keep": keep, "sb_end": 0.875, **ANNEALED[name][1]}
        if "sb_staleness" in overrides:
            overrides["sb_staleness"] = staleness
        return Strategy(name, ANNEALED[name][0].format(keep=keep, n=staleness), overrides)
    if name in RHO_RULES:
        if reference_model is None:
            raise ValueError(f"strategy {name!r} needs --reference_model: the folder of a model trained on a holdout")
        rule, label, stale = RHO_RULES[name]
        overrides = {"sb_strategy": "rholoss", "sb_keep": keep, "sb_rho_rule": rule}
        if stale:
            overrides["sb_staleness"] = staleness
        return Strategy(name, label.format(n=staleness), {**overrides, "sb_reference_model": reference_model})
    if name == "composer-card":
        # The setting Composer's method card recommends: selection from 50 % to 90 % of training, keep half,
        # every other step a plain batch.
        return Strategy(
            name,
            "Composer (start 0.5, end 0.9, keep 0.5, interrupt 2)",
            {"sb_strategy": "composer", "sb_keep": 0.5, "sb_start": 0.5, "sb_end": 0.9, "sb_interrupt": 2},
        )
    if name.startswith("uniform-for-"):
        # The random-subset control of another strategy, at the kept fraction (--keep) that strategy realised.
        controlled = name.removeprefix("uniform-for-")
        label = f"Uniform, keep {keep:.2f} (control of {controlled})"
        return Strategy(name, label, {"sb_strategy": "uniform", "sb_keep": keep})
    if name in ("kath18", "composer", "uniform", "topk"):
        labels = {"kath18": "Kath18", "composer": "Composer", "uniform": "Uniform", "topk": "Top-k"}
        return Strategy(name, labels[name], {"sb_strategy": name, "sb_keep": keep})
    raise ValueError(
        f"unknown strategy {name!r}: choose from traditional, sb, stale-sb, sb-warmup, sb-train-mode, kath18, "
        f"composer, composer-card, uniform, uniform-for-<strategy>, topk, infobatch, infobatch-r<ratio>, "
        f"<strategy>-keep<fraction>, "
        f"{', '.join(RHO_RULES)}, {', '.join(ANNEALED)}"
    )
