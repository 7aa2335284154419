"""The strategies a benchmark compares, as `SelectiveBackpropConfig` overrides."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from hf_selective_backprop.config_checks import ANNEALING_STRATEGIES

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


#: One run that prunes once after its first epoch: name -> label. The random one is the ranking's control.
EARLY_PRUNE = {
    "early-prune": "Early prune (highest first-epoch loss)",
    "early-coverage": "Early coverage (CCS over first-epoch losses)",
    "early-class-budget": "Early class budgets (NUCS over first-epoch losses)",
    "early-random": "Early random subset",
}


class Knob(NamedTuple):
    flag: str  # the SelectiveBackpropConfig field it sets
    label: str  # how a report's label names it
    description: str  # how an error names it
    applies: Callable[[dict], bool]  # whether a strategy with these overrides has it


#: Knobs a name can end with, each setting one flag of the strategy before it: suffix -> (flag, what it is called
#: in labels and errors, which strategies have it). Several can follow each other: stale-sb-n2-keep0.5,
#: infobatch-r0.3-delta0.75. A sweep over a strategy's saving knob is a list of such names.
KNOBS = {
    "keep": Knob("sb_keep", "keep", "kept fraction", lambda overrides: "sb_keep" in overrides),
    "n": Knob("sb_staleness", "n", "staleness", lambda overrides: "sb_staleness" in overrides),
    "r": Knob("sb_prune_ratio", "r", "prune ratio", lambda overrides: overrides.get("sb_strategy") == "infobatch"),
    "delta": Knob(
        "sb_anneal_delta", "delta", "annealing delta",
        lambda overrides: overrides.get("sb_strategy") in ANNEALING_STRATEGIES,
    ),
    "end": Knob("sb_end", "end", "end of selection", lambda overrides: "sb_end" in overrides),
}
# Longest prefix first: "delta" before a one-letter knob could claim it.
_KNOB_PATTERN = re.compile(r"^(.+)-(" + "|".join(sorted(KNOBS, key=len, reverse=True)) + r")([^-]*)$")


def _trailing_knob(name: str) -> tuple[str, Knob, float | int] | None:
    """``(base, knob, value)`` when ``name`` ends with a knob (-keep0.5, -n2, ...); None when it does not.

    A one-letter knob followed by a letter is part of a strategy's name (stale-rholoss ends in "r" + "holoss")."""
    match = _KNOB_PATTERN.match(name)
    if match is None:
        return None
    base, prefix, text = match.groups()
    knob = KNOBS[prefix]
    try:
        value = int(text) if knob.flag == "sb_staleness" else float(text)
    except ValueError as error:
        if len(prefix) == 1 and not text[:1].isdigit():
            return None
        kind = "a whole number" if knob.flag == "sb_staleness" else "a number"
        raise ValueError(
            f"strategy {name!r}: the {knob.description} after -{prefix} must be {kind}, got {text!r}"
        ) from error
    return base, knob, value


def _without_knobs(name: str) -> str:
    """The strategy ``name`` names before its knobs (stale-sb-anneal-n2 -> stale-sb-anneal)."""
    while (trailing := _trailing_knob(name)) is not None:
        name = trailing[0]
    return name


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
    """`name` is one of traditional, sb, sb-weighted, stale-sb, kath18, composer, uniform, topk, infobatch, early-prune,
    early-coverage, early-class-budget, early-random, sb-warmup,
    sb-train-mode, rholoss, rholoss-cdf, stale-rholoss (these three score with ``reference_model``, a folder
    scripts/train.py wrote), optionally followed by knobs (`KNOBS`: stale-sb-n2-keep0.5)."""
    if name == "traditional":
        return Strategy(name, "Traditional", {"sb_strategy": "none"})
    trailing = None if name.startswith("uniform-for-") else _trailing_knob(name)
    if trailing is not None:
        base, knob, value = trailing
        if knob.flag == "sb_keep":
            keep = value
        elif knob.flag == "sb_staleness":
            staleness = value
        strategy = build_strategy(base, keep, staleness, warmup_epochs, reference_model)
        if not knob.applies(strategy.overrides):
            raise ValueError(f"strategy {name!r}: {base} has no {knob.description} to set")
        label = strategy.label
        # A stale strategy's label names its n already, and an annealed one's its kept fraction.
        if not (knob.flag == "sb_staleness" or (knob.flag == "sb_keep" and _without_knobs(base) in ANNEALED)):
            label = f"{label}, {knob.label} {value:g}"
        return Strategy(name, label, {**strategy.overrides, knob.flag: value})
    if name == "sb":
        return Strategy(name, "SB", {"sb_strategy": "sb", "sb_keep": keep})
    if name == "sb-weighted":
        # SB's unbiased variant: each kept example's loss weighted by 1 / its selection probability.
        return Strategy(name, "SB, reweighted", {"sb_strategy": "sb", "sb_keep": keep, "sb_importance_weighting": True})
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
    if name in EARLY_PRUNE:
        return Strategy(name, EARLY_PRUNE[name], {"sb_strategy": name.replace("-", "_"), "sb_keep": keep})
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
        f"composer, composer-card, uniform, uniform-for-<strategy>, topk, infobatch, sb-weighted, early-prune, "
        f"early-coverage, early-class-budget, early-random, "
        f"followed by knobs -keep<fraction>, -n<staleness>, -r<prune ratio>, -delta<anneal delta>, -end<share>, "
        f"{', '.join(RHO_RULES)}, {', '.join(ANNEALED)}"
    )
