"""Coverage-centric selection (CCS, Zheng et al., ICLR 2023): a subset that spans the range of difficulty.

Keeping only the hardest examples collapses at high pruning rates: the subset loses the easy and middle part of the
distribution, and its hardest few percent are mostly mislabeled or ambiguous. CCS drops that hardest share first,
splits the rest into strata of equal width over the score, and fills the budget stratum by stratum from the
sparsest up, each taking an even share of what is left (all of a stratum smaller than its share), drawn at random.
"""

from __future__ import annotations

import torch

#: CCS's number of strata (its experiments' k = 50).
COVERAGE_STRATA = 50
#: The hardest share dropped before stratifying: CCS tunes this cutoff (beta) per pruning rate, from 0 at light
#: pruning to 0.3-0.4 at 90 %; a tenth is the middle of its range at the kept shares of 0.3-0.5 this package tests.
COVERAGE_HARD_CUTOFF = 0.1


def coverage_choice(scores: torch.Tensor, count: int, generator: torch.Generator,
                    strata: int = COVERAGE_STRATA, hard_cutoff: float = COVERAGE_HARD_CUTOFF) -> torch.Tensor:
    """``count`` positions of ``scores`` (higher: harder) chosen by CCS, ascending. Unscored positions (NaN) are
    kept first, as nothing says they are easy; the hard cutoff shrinks where dropping it would leave fewer than
    ``count`` to choose from."""
    if not 0 <= count <= scores.numel():
        raise ValueError(f"count must be in [0, {scores.numel()}], got {count}")
    if not 0.0 <= hard_cutoff < 1.0:
        raise ValueError(f"hard_cutoff must be in [0, 1), got {hard_cutoff}")
    values = scores.detach().double().cpu()
    unscored = torch.nonzero(torch.isnan(values)).flatten()
    if unscored.numel() >= count:
        return torch.sort(unscored[torch.randperm(unscored.numel(), generator=generator)[:count]]).values
    budget = count - unscored.numel()
    scored = torch.nonzero(~torch.isnan(values)).flatten()
    hardest_first = scored[torch.argsort(values[scored], descending=True, stable=True)]
    dropped = min(int(hard_cutoff * scored.numel()), scored.numel() - budget)
    pool = hardest_first[dropped:]
    pool_scores = values[pool]
    low, high = float(pool_scores.min()) if pool.numel() else 0.0, float(pool_scores.max()) if pool.numel() else 0.0
    width = (high - low) / strata
    bins = ((pool_scores - low) / width).floor().clamp(max=strata - 1).long() if width > 0 else \
        torch.zeros_like(pool, dtype=torch.long)
    members = [pool[bins == b] for b in range(strata)]
    members = sorted((m for m in members if m.numel()), key=lambda m: m.numel())
    chosen = [unscored]
    for position, stratum in enumerate(members):
        share = min(stratum.numel(), budget // (len(members) - position))
        chosen.append(stratum[torch.randperm(stratum.numel(), generator=generator)[:share]])
        budget -= share
    return torch.sort(torch.cat(chosen)).values
