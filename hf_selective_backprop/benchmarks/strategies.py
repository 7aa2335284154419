"""The strategies a benchmark compares, as `SelectiveBackpropConfig` overrides."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_STRATEGIES = ("traditional", "sb", "stale-sb", "kath18", "composer", "uniform")


@dataclass(frozen=True)
class Strategy:
    name: str
    label: str
    overrides: dict = field(default_factory=dict)

    @property
    def cycle(self) -> int:
        """Epochs after which the per-epoch cost repeats (Stale-SB: n)."""
        return int(self.overrides.get("sb_staleness", 1))


def build_strategy(name: str, keep: float, staleness: int, warmup_epochs: int) -> Strategy:
    """`name` is one of traditional, sb, stale-sb, kath18, composer, uniform, topk, sb-warmup."""
    if name == "traditional":
        return Strategy(name, "Traditional", {"sb_strategy": "none"})
    if name == "sb":
        return Strategy(name, "SB", {"sb_strategy": "sb", "sb_keep": keep})
    if name == "stale-sb":
        return Strategy(
            name, f"Stale-SB (n={staleness})", {"sb_strategy": "sb", "sb_keep": keep, "sb_staleness": staleness}
        )
    if name == "sb-warmup":
        return Strategy(
            name,
            f"SB after {warmup_epochs} full epochs",
            {"sb_strategy": "sb", "sb_keep": keep, "sb_warmup_epochs": warmup_epochs},
        )
    if name in ("kath18", "composer", "uniform", "topk"):
        labels = {"kath18": "Kath18", "composer": "Composer", "uniform": "Uniform", "topk": "Top-k"}
        return Strategy(name, labels[name], {"sb_strategy": name, "sb_keep": keep})
    raise ValueError(
        f"unknown strategy {name!r}: choose from traditional, sb, stale-sb, sb-warmup, kath18, composer, uniform, topk"
    )
