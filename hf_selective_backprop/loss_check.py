"""The check, when a selective trainer is built, that the automatic per-example loss fits its model.

A model whose outputs the automatic loss does not fit fails at construction, with an error naming
``per_example_loss_func``, instead of in the first step or, worse, by selecting on wrong losses.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import torch
from transformers.trainer_utils import has_length

from . import _compat
from .engine import distributed
from .engine.batch_rows import check_rows
from .engine.data_state import stateful_sources
from .losses import ExampleLoss, NoPerExampleLoss, PerExampleLoss, logits_of, recognized_head

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


def check_per_example_loss(model, scorer, make_batch: Callable[[], dict], index_column: str,
                           sources: dict, loss_fn: PerExampleLoss) -> None:
    """Score one small batch and raise a ValueError naming the model class and ``per_example_loss_func``
    unless the automatic per-example loss fits the model.

    Two checks: ``scorer`` must give a tensor of one loss per example (skipped for the heads
    `recognized_head` knows), and the per-example losses must average to the loss the model itself
    returns on those rows (`check_agrees_with_model_loss`). ``make_batch`` collates the batch; the random
    state it may draw from (the global RNG and the ``state_dict`` of ``sources``: an augmenting dataset or
    collator) is restored afterwards, so the check changes nothing a run depends on.
    """
    if not isinstance(loss_fn, ExampleLoss):
        return
    saved = {name: copy.deepcopy(source.state_dict()) for name, source in sources.items()}
    try:
        with torch.random.fork_rng(devices=_cuda_devices()):
            batch = make_batch()
    finally:
        for name, source in sources.items():
            source.load_state_dict(saved[name])
    inputs = {key: value for key, value in batch.items() if key != index_column}
    if not recognized_head(model):
        _check_scorer_shape(model, scorer, inputs, loss_fn)
    check_agrees_with_model_loss(model, inputs, loss_fn, scorer.label_name)


def _cuda_devices() -> list[int]:
    return [torch.cuda.current_device()] if torch.cuda.is_available() else []


def _check_scorer_shape(model, scorer, inputs: dict, loss_fn: ExampleLoss) -> None:
    rows = len(next(iter(inputs.values())))
    advice = (f"the automatic per-example loss ({loss_fn.task}) does not fit the outputs of {type(model).__name__}"
              ": pass per_example_loss_func=(outputs, labels) -> a tensor with one loss per example")
    try:
        with torch.random.fork_rng(devices=_cuda_devices()):
            losses = scorer(model, inputs)
    except (KeyError, IndexError, RuntimeError, TypeError, ValueError) as error:
        if isinstance(error, ValueError) and "per_example_loss_func" not in str(error):
            raise  # an error of the data or of a flag, which names its own fix
        # TypeError: a forward that needs its labels, which the selection forward does not pass
        raise NoPerExampleLoss(f"{advice} ({type(error).__name__}: {error})") from error
    if losses.shape != (rows,):
        raise NoPerExampleLoss(f"{advice} (it gave shape {tuple(losses.shape)} for a batch of {rows})")


def own_loss(outputs) -> torch.Tensor | None:
    """The loss a model returned beside its outputs (a ``loss`` entry, or a tuple's leading scalar), if any."""
    if isinstance(outputs, dict) or hasattr(outputs, "loss"):
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs.loss
    elif isinstance(outputs, (tuple, list)) and outputs:
        loss = outputs[0]
    else:
        return None
    return loss if torch.is_tensor(loss) and loss.dim() == 0 else None


#: How far the mean per-example loss may sit from the model's own loss: float32 against the model's own
#: reduction (or a half-precision one); a loss of another kind is off by far more.
AGREEMENT_RTOL, AGREEMENT_ATOL = 1e-2, 1e-4


def check_agrees_with_model_loss(model, inputs: dict, loss_fn: ExampleLoss, label_name: str) -> None:
    """Raise a ValueError unless ``loss_fn``'s per-example losses of ``inputs`` average to the model's own loss.

    The average is the model's reduction (loss items summed over the batch, divided by their count), taken
    without label smoothing, which the Trainer applies outside the model. A model that returns no loss, or
    cannot be called with these inputs and their labels, is not compared (the Trainer's first step says why).
    """
    labels = inputs.get(label_name)
    if labels is None:
        return
    was_training = model.training
    model.eval()  # no dropout, no update of BatchNorm statistics
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=_cuda_devices()):
            outputs = model(**inputs)
    except (TypeError, RuntimeError, ValueError, KeyError):
        return
    finally:
        model.train(was_training)
    expected = own_loss(outputs)
    if expected is None or not bool(torch.isfinite(expected)):
        return
    unsmoothed = copy.copy(loss_fn)
    unsmoothed.label_smoothing = 0.0
    sums, counts = unsmoothed.sums_and_counts(outputs, labels)
    if float(counts.sum()) == 0:
        return
    mean = (sums.sum() / counts.sum()).float()
    if not bool(torch.isclose(mean, expected.detach().float().to(mean.device), AGREEMENT_RTOL, AGREEMENT_ATOL)):
        kind = loss_fn.task
        if kind == "classification":
            kind = loss_fn.problem_type(labels, logits_of(outputs))
        raise NoPerExampleLoss(
            f"the automatic per-example loss ({kind}) of {type(model).__name__}'s outputs averages {float(mean):.6g} "
            f"on the first training rows, where the model's own loss is {float(expected):.6g}: selection would rank "
            "examples by a loss the model does not train on. Pass per_example_loss_func=(outputs, labels) -> one "
            "loss per example whose mean is the model's loss (or set the config's problem_type, e.g. 'regression')"
        )
