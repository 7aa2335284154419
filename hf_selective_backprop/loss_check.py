"""The check, when a selective trainer is built, that the automatic per-example loss fits its model.

A model whose outputs the automatic loss does not fit fails at construction, with an error naming
``per_example_loss_func``, instead of in the first step or, worse, by selecting on wrong losses.
"""

from __future__ import annotations

import logging

import torch
from transformers.trainer_utils import has_length

from . import _compat
from .engine import distributed
from .engine.batch_rows import check_rows
from .engine.data_state import stateful_sources
from .losses import check_per_example_loss

logger = logging.getLogger(__name__)


def check_on_first_rows(trainer) -> None:
    """Score ``trainer``'s first (at most two) training rows with its per-example loss and compare with the
    model's own loss on them, when the run reads per-example losses at all; the random state the collation
    draws from is restored afterwards."""
    selector, engine = trainer.selector, trainer.engine
    if not (selector.needs_losses or selector.produces_weights or engine.records_training_losses):
        return  # uniform without weights or a store: the per-example loss is never computed
    dataset = trainer.train_dataset
    if isinstance(dataset, torch.utils.data.IterableDataset) or not has_length(dataset) or len(dataset) == 0:
        return
    # DeepSpeed and FSDP place the model when training starts: a forward now would meet weights on the host beside
    # rows on the device, or ZeRO-3 shards that only DeepSpeed's engine gathers (gathering them here would need
    # the whole model on one device, what ZeRO-3 avoids).
    unplaced = distributed.why_unplaced(trainer.model, trainer.args.device)
    if unplaced is not None:
        logger.warning("the automatic per-example loss is not checked against %s's own loss when the trainer is "
                       "built: %s", type(trainer.model).__name__, unplaced)
        return

    def first_rows() -> dict:
        batch = _compat.collated_rows(trainer, dataset, min(2, len(dataset)), "training")
        check_rows(batch)
        return _compat.input_preparation(trainer)(batch)

    check_per_example_loss(
        trainer.model, engine.scorer, first_rows, trainer.args.sb_index_column,
        stateful_sources(dataset, trainer.data_collator), trainer.per_example_loss_func,
    )
