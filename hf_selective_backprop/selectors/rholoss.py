"""RHO-LOSS (Mindermann et al., ICML 2022): select by reducible loss, not by loss.

A reducible loss is an example's current loss minus its *irreducible* loss, the loss a reference
model trained on held-out data gives it. A mislabeled example stays hard for both models, so its
reducible loss is low and it is skipped; so is an example the model has already learned. The
engine subtracts the irreducible losses (it knows each row's id); these selectors see reducible
losses in place of losses and apply a plain rule to them.
"""

from __future__ import annotations

from .percentile import PercentileSelector
from .topk import TopKSelector


class RhoLossSelector(TopKSelector):
    """RHO-LOSS's own rule: keep the ``keep`` fraction of each selection batch with the highest reducible loss."""

    uses_reference_losses = True


class RhoLossCDFSelector(PercentileSelector):
    """SB's rule on reducible losses: keep each row with probability ``CDF_R(reducible loss) ** beta``."""

    uses_reference_losses = True
