"""Per-example losses that match the model's own loss.

Selection ranks examples by a per-example loss, and a weighted strategy trains on
``sum_i w_i * loss_sum_i / num_items``. Both must agree with the loss the model (or the
Trainer's label smoother) computes, so each loss here is a pair per example: the sum of its
loss items and how many items it has (1 for a class label, one per non-ignored token, one per
label entry for multi-label and multi-output regression). The example's loss is sum / count;
the model's own loss is the sum over the batch divided by the item count, which is exactly
the Trainer's ``num_items_in_batch`` when it passes one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .default_strategy import CannotSelect

#: (model outputs, labels) -> one loss per example, shape (batch,).
PerExampleLoss = Callable[[object, torch.Tensor], torch.Tensor]

TASKS = ("classification", "token-classification", "causal-lm", "seq2seq-lm")
IGNORE_INDEX = -100
#: Logit elements (tokens x vocabulary) turned into float32 at a time by the token losses: bounds the
#: selection pass's extra memory for large vocabularies (64 MiB of float32 per chunk).
TOKEN_CHUNK_ELEMENTS = 1 << 24


class NoPerExampleLoss(CannotSelect):
    """The automatic per-example loss does not fit the model's outputs (a model that returns only its loss, a
    head it does not know): selection needs ``per_example_loss_func``; the example record turns itself off."""


def logits_of(outputs) -> torch.Tensor:
    """The logits in a model's outputs, found as `Trainer.prediction_step` finds them.

    A tuple (``return_dict=False``) starts with the loss when the model was given labels; a dict
    without a ``logits`` key must hold exactly one tensor besides ``loss``.
    """
    if torch.is_tensor(outputs):
        return outputs
    if isinstance(outputs, dict):
        if outputs.get("logits") is not None:
            return outputs["logits"]
        others = {key: value for key, value in outputs.items() if key != "loss" and torch.is_tensor(value)}
        if len(others) != 1:
            raise NoPerExampleLoss(
                f"the model's outputs have no 'logits' and not exactly one other tensor (keys: {sorted(outputs)}): "
                "pass per_example_loss_func=(outputs, labels) -> one loss per example"
            )
        return next(iter(others.values()))
    if hasattr(outputs, "logits"):
        return outputs.logits
    # The Trainer's convention: (loss, logits, ...) when the forward had labels, (logits, ...) without.
    first = outputs[0]
    return outputs[1] if torch.is_tensor(first) and first.dim() == 0 and len(outputs) > 1 else first


class BadRowsError(ValueError):
    """A ValueError caused by some rows of a batch: ``rows`` are their positions in it (along its first dimension),
    from which a caller that holds the rows' ids names the examples."""

    def __init__(self, message: str, rows: list[int]):
        super().__init__(message)
        self.rows = rows


def check_class_labels(labels: torch.Tensor, num_classes: int, label_name: str = "labels") -> None:
    """Raise a `BadRowsError` naming the column if a class label is outside [0, num_classes) and not -100.

    PyTorch's own error comes from deep inside cross-entropy (an IndexError on CPU, a device-side
    assert that kills the process on CUDA) and names neither the column nor the valid range.
    """
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        return
    bad = ((labels < 0) & (labels != IGNORE_INDEX)) | (labels >= num_classes)
    if bool(bad.any()):
        values = sorted(set(labels[bad].tolist()))
        rows = bad.reshape(len(bad), -1).any(dim=1).nonzero().flatten().tolist() if bad.dim() else [0]
        raise BadRowsError(
            f"the {label_name!r} column holds {values[:5]}{' ...' if len(values) > 5 else ''}, outside the "
            f"model's {num_classes} classes: class labels must be integers in [0, {num_classes - 1}], "
            "or -100 to ignore a row",
            rows,
        )


def cross_entropy_per_example(
    outputs, labels: torch.Tensor, label_smoothing: float = 0.0, label_name: str = "labels", check_labels: bool = True
) -> torch.Tensor:
    """Cross-entropy per example: the mean of it over non-ignored rows is the Trainer's loss.

    Computed in float32 so a bf16 selection pass ranks examples on the same scale as fp32.
    Rows labelled -100 get loss 0, as they contribute nothing to the model's loss. Labels
    outside the logits' classes raise a ValueError naming ``label_name`` (unless not ``check_labels``).
    """
    logits = logits_of(outputs)
    if check_labels and logits.dim() == 2 and labels.dim() == 1:
        check_class_labels(labels, logits.shape[-1], label_name)
    return F.cross_entropy(
        logits.float(),
        labels,
        reduction="none",
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
    )


class ExampleLoss:
    """The per-example loss of one kind of model, as (sum, count) pairs and as their ratio.

    Calling it gives each example's loss: for token-level tasks the mean over the example's
    non-ignored tokens (0 for an example with none), which is what selection ranks.

    Args:
        task: ``"classification"`` (sequence or image classification: transformers' problem_type
            rules for single-label, multi-label and regression), ``"token-classification"``,
            ``"causal-lm"`` (token t's logits predict label t+1, as transformers' causal-LM loss) or
            ``"seq2seq-lm"`` (an encoder-decoder LM: token t's logits predict label t, no shift).
        config: the model's config; its ``problem_type`` and ``num_labels`` pick the classification
            loss. Without one, classification is single-label cross-entropy.
        label_smoothing: the Trainer's ``label_smoothing_factor``. Applied to class and token
            labels as transformers' ``LabelSmoother`` does, not to multi-label classification (the
            Trainer turns it off there); regression has no classes to smooth and is refused.
    """

    def __init__(self, task: str = "classification", config=None, label_smoothing: float = 0.0,
                 label_name: str = "labels"):
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
        self.task = task
        self.config = config
        self.label_smoothing = label_smoothing
        self.label_name = label_name
        #: Whether class labels are checked first (`check_class_labels`, one wait for the device a call);
        #: `labels_already_read` turns it off where the model's own loss has read the same labels.
        self.check_labels = True

    def __call__(self, outputs, labels: torch.Tensor) -> torch.Tensor:
        sums, counts = self.sums_and_counts(outputs, labels)
        return sums / counts.clamp_min(1)

    def sums_and_counts(self, outputs, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per example: the sum of its loss items (float32) and how many there are."""
        logits = logits_of(outputs)
        if self.task == "causal-lm":
            return self._token_losses(logits[:, :-1], labels[:, 1:])
        if self.task in ("token-classification", "seq2seq-lm"):
            return self._token_losses(logits, labels)
        problem_type = self.problem_type(labels, logits)
        if problem_type == "single_label_classification":
            if labels.dtype.is_floating_point and labels.shape == logits.shape:
                # Class probabilities (soft targets): one item per example.
                losses = cross_entropy_per_example(logits, labels, self.label_smoothing, self.label_name,
                                                   self.check_labels)
                return losses, torch.ones_like(losses)
            losses = cross_entropy_per_example(logits, labels.reshape(-1), self.label_smoothing, self.label_name,
                                               self.check_labels)
            return losses, (labels.reshape(-1) != IGNORE_INDEX).to(losses.dtype)
        if self.label_smoothing and problem_type == "regression":
            raise ValueError(
                "--label_smoothing_factor smooths class labels, and this model does regression "
                "(problem_type='regression'): set it to 0"
            )
        rows = logits.shape[0]
        logits, labels = logits.float().reshape(rows, -1), labels.float().reshape(rows, -1)
        if problem_type == "regression":
            items = (logits - labels) ** 2
        else:
            items = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
        return items.sum(dim=1), torch.full_like(items[:, 0], items.shape[1])

    def margins(self, outputs, labels: torch.Tensor) -> torch.Tensor | None:
        """Per example, the gold label's logit minus the largest other logit (float32; NaN for a row labelled
        -100): the margin whose mean over training is the area under the margin (AUM, Pleiss et al., 2020).
        Defined for single-label classification with class labels; None for any other task or labels."""
        if self.task != "classification":
            return None
        logits = logits_of(outputs)
        if (logits.dim() != 2 or logits.shape[1] < 2 or labels.dtype.is_floating_point
                or labels.numel() != logits.shape[0]
                or self.problem_type(labels, logits) != "single_label_classification"):
            return None
        labels = labels.reshape(-1, 1)
        logits = logits.float()
        gold_column = labels.clamp_min(0)  # an ignored row's -100 reads column 0, then its margin is NaN
        gold = logits.gather(1, gold_column).squeeze(1)
        largest_other = logits.scatter(1, gold_column, float("-inf")).amax(dim=1)
        return torch.where(labels.squeeze(1) == IGNORE_INDEX, float("nan"), gold - largest_other)

    def problem_type(self, labels: torch.Tensor, logits: torch.Tensor | None = None) -> str:
        """transformers' rule: the config's problem_type, else regression for one output, else
        single-label for int32/int64 labels and multi-label for any other. A model without a config
        is single-label.

        One output means ``num_labels == 1`` or, whatever ``num_labels`` says, float labels beside logits
        with one value per example: a custom regression model keeps the config's default of 2 labels,
        and binary cross-entropy on its outputs would rank examples by a loss it never trains on.
        """
        problem_type = getattr(self.config, "problem_type", None)
        if problem_type is not None:
            return problem_type
        one_output = logits is not None and logits.dim() >= 1 and logits.numel() == logits.shape[0]
        if labels.dtype.is_floating_point and one_output and labels.numel() == labels.shape[0]:
            return "regression"
        num_labels = getattr(self.config, "num_labels", None)
        if num_labels is None:
            return "single_label_classification"
        if num_labels == 1:
            return "regression"
        if labels.dtype in (torch.long, torch.int):
            return "single_label_classification"
        return "multi_label_classification"

    def _token_losses(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.check_labels:
            check_class_labels(labels, logits.shape[-1], self.label_name)
        rows, width, vocabulary = logits.shape
        tokens = torch.zeros(rows, width, dtype=torch.float32, device=logits.device)
        # A float32 copy of all [rows * width, vocabulary] logits would be gigabytes for a large
        # vocabulary: convert and score TOKEN_CHUNK_ELEMENTS of them at a time.
        per_chunk = max(1, TOKEN_CHUNK_ELEMENTS // vocabulary)
        if per_chunk >= width:
            step = per_chunk // width
            chunks = [(slice(r, r + step), slice(None)) for r in range(0, rows, step)]
        else:
            chunks = [(slice(r, r + 1), slice(t, t + per_chunk))
                      for r in range(rows) for t in range(0, width, per_chunk)]
        for row_slice, column_slice in chunks:
            chunk_labels = labels[row_slice, column_slice]
            tokens[row_slice, column_slice] = F.cross_entropy(
                logits[row_slice, column_slice].float().flatten(0, 1),
                chunk_labels.flatten(),
                reduction="none",
                ignore_index=IGNORE_INDEX,
                label_smoothing=self.label_smoothing,
            ).view(chunk_labels.shape)
        return tokens.sum(dim=1), (labels != IGNORE_INDEX).sum(dim=1).to(tokens.dtype)


def example_margins(loss_fn: PerExampleLoss, outputs, labels: torch.Tensor) -> torch.Tensor | None:
    """``loss_fn``'s per-example margins (`ExampleLoss.margins`); None where it defines none (a custom
    per_example_loss_func, or a task without margins)."""
    margins_of = getattr(loss_fn, "margins", None)
    return margins_of(outputs, labels) if margins_of is not None else None


def model_task(model) -> str:
    """The task a model's loss serves, read the way the Trainer reads it: causal LM if its loss shifts
    labels or it is a causal-LM class, token classification if it is a token-classification class,
    else classification."""
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    )
    from transformers.trainer_utils import unwrap_peft_model

    model = unwrap_peft_model(model)  # a PEFT adapter model (TRL's SFTTrainer(peft_config=...)): its base's head
    name = type(model).__name__
    config = getattr(model, "config", None)
    if name in _names(MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES):
        return "seq2seq-lm"
    shifts = LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss
    if (shifts and not getattr(config, "is_encoder_decoder", False)) or name in _names(
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    ):
        return "causal-lm"
    if name in _names(MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES):
        return "token-classification"
    return "classification"


def recognized_head(model) -> bool:
    """Whether ``model`` is a transformers task head whose loss `model_task` reads (so the automatic
    per-example loss is known to fit it, not a guess)."""
    from transformers.models.auto import modeling_auto

    mappings = ("CAUSAL_LM", "SEQ_TO_SEQ_CAUSAL_LM", "TOKEN_CLASSIFICATION", "SEQUENCE_CLASSIFICATION",
                "IMAGE_CLASSIFICATION")
    from transformers.trainer_utils import unwrap_peft_model

    name = type(unwrap_peft_model(model)).__name__
    return any(name in _names(getattr(modeling_auto, f"MODEL_FOR_{kind}_MAPPING_NAMES")) for kind in mappings)


def _names(mapping) -> set[str]:
    names = set()
    for value in mapping.values():
        names.update((value,) if isinstance(value, str) else value)
    return names


@contextlib.contextmanager
def labels_already_read(loss_fn: PerExampleLoss):
    """Within: ``loss_fn`` (an `ExampleLoss`; any other callable is left as it is) does not check class labels.

    For a per-example loss computed after the model's own loss on the same labels, which fails on a bad one
    first: the check would add nothing but a wait for the device, once every training step."""
    checks = getattr(loss_fn, "check_labels", None)
    if checks is None:
        yield
        return
    loss_fn.check_labels = False
    try:
        yield
    finally:
        loss_fn.check_labels = checks


def per_example_loss_for(model, label_smoothing: float = 0.0, label_name: str = "labels",
                         task: str | None = None) -> ExampleLoss:
    """The per-example loss matching ``model``'s own loss (``task`` overrides the detected one)."""
    return ExampleLoss(task or model_task(model), getattr(model, "config", None), label_smoothing, label_name)


def loss_terms(loss_fn: PerExampleLoss, outputs, labels: torch.Tensor):
    """(per-example losses, per-example loss sums, the batch's item count) for a weighted loss.

    A plain callable gives one loss per example; its batch is normalised by the non-ignored labels,
    as transformers counts ``num_items_in_batch``.
    """
    losses, sums, counts = _loss_sums_and_counts(loss_fn, outputs, labels)
    return losses, sums, counts.sum() if isinstance(loss_fn, ExampleLoss) else (labels != IGNORE_INDEX).sum()


def _loss_sums_and_counts(loss_fn: PerExampleLoss, outputs, labels: torch.Tensor):
    """(per-example losses, their sums, their item counts): a plain callable's examples count one item each."""
    if isinstance(loss_fn, ExampleLoss):
        sums, counts = loss_fn.sums_and_counts(outputs, labels)
        return sums / counts.clamp_min(1), sums, counts
    losses = loss_fn(outputs, labels)
    return losses, losses, torch.ones_like(losses)


def weighted_loss(loss_fn: PerExampleLoss, outputs, labels: torch.Tensor, weights: torch.Tensor,
                  num_items_in_batch=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_i w_i * loss_sum_i / num_items`` and the per-example losses.

    ``num_items`` is the Trainer's ``num_items_in_batch`` (the step's items over all accumulated
    micro-batches) when given, else this batch's items: with every weight 1 this is the model's
    own loss whenever the model normalises by ``num_items_in_batch`` (transformers' causal-LM loss,
    the Trainer's label smoother) or the step has one micro-batch.
    """
    loss, losses, _ = weighted_loss_and_estimate(loss_fn, outputs, labels, weights, num_items_in_batch)
    return loss, losses


def weighted_loss_and_estimate(loss_fn: PerExampleLoss, outputs, labels: torch.Tensor, weights: torch.Tensor,
                               num_items_in_batch=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`weighted_loss`'s two, and the factor that turns the weighted loss into the weighted *mean*: the items
    over the weighted items. Weights that rescale a pruned batch (InfoBatch's 1/(1-r)) sum past the batch's
    size, so the weighted loss climbs as pruning grows; the weighted mean estimates the mean loss of every
    example, the number the Trainer logs as ``loss``."""
    losses, sums, counts = _loss_sums_and_counts(loss_fn, outputs, labels)
    items = counts.sum() if isinstance(loss_fn, ExampleLoss) else (labels != IGNORE_INDEX).sum()
    denominator = num_items_in_batch if num_items_in_batch is not None else items
    if torch.is_tensor(denominator):
        denominator = denominator.to(sums.device).clamp_min(1)
    else:
        denominator = max(denominator, 1)
    weighted_items = (weights * counts).sum()
    estimate = torch.where(weighted_items > 0, counts.sum() / weighted_items.clamp_min(1e-12), 1.0)
    return (sums * weights).sum() / denominator, losses, estimate.detach()
