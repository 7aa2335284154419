"""Irreducible losses for RHO-LOSS: one float per training example, from a reference model or a column.

RHO-LOSS (Mindermann et al., ICML 2022) trains a small reference model on a holdout split and takes
its loss on each training example as that example's *irreducible* loss. Here the reference model
scores the whole training set once, before the first step (eval mode, no gradients, no
augmentation, each process its share through Accelerate), and the table is saved with every
checkpoint so a resumed run never scores it again.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from .. import _compat
from ..losses import logits_of, model_task, per_example_loss_for
from . import distributed, streams
from .indexing import IndexedDataset, ids_by_position, keeping_ids
from .scoring import SelectionScorer, naming_examples

logger = logging.getLogger(__name__)

MODEL_FLAG = "--sb_reference_model"
COLUMN_FLAG = "--sb_reference_column"


class IrreducibleLosses:
    """The irreducible loss of every example, indexed by its id (NaN where none is known)."""

    def __init__(self, losses: torch.Tensor):
        self.losses = losses.detach().to("cpu", torch.float32)

    @classmethod
    def from_pairs(cls, ids: torch.Tensor, losses: torch.Tensor) -> IrreducibleLosses:
        ids = ids.reshape(-1).to("cpu", torch.int64)
        table = torch.full((int(ids.max()) + 1 if ids.numel() else 0,), float("nan"))
        table[ids] = losses.reshape(-1).to("cpu", torch.float32)
        return cls(table)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.reshape(-1).to("cpu", torch.int64)
        known = ids < self.losses.numel()
        out = torch.full(ids.shape, float("nan"))
        out[known] = self.losses[ids[known]]
        return out

    def reducible(self, ids: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        """``losses`` (CPU, one per id) minus the ids' irreducible losses."""
        return losses.float() - self.lookup(ids)

    def check_covers(self, ids: torch.Tensor, source: str) -> None:
        """Every training id needs a finite irreducible loss: a NaN would silently never be selected."""
        missing = ~torch.isfinite(self.lookup(ids))
        if bool(missing.any()):
            bad = ids.reshape(-1)[missing][:5].tolist()
            raise ValueError(
                f"{source} gives no finite irreducible loss for {int(missing.sum())} of {ids.numel()} training "
                f"examples (ids {bad}{' ...' if int(missing.sum()) > 5 else ''}): rholoss ranks every example by "
                "its loss minus its irreducible loss, so each needs one"
            )

    def state_dict(self) -> dict:
        return {"losses": self.losses.clone()}

    @classmethod
    def from_state_dict(cls, state: dict) -> IrreducibleLosses:
        return cls(state["losses"])


@dataclass
class ReferencePass:
    """What scoring the training set with the reference model cost, on this process."""

    table: IrreducibleLosses
    forwards: int
    seconds: float


class Reference:
    """For 'rholoss': where the irreducible losses come from, a column's table or the reference model that will
    score them. Resolved when the trainer is built (`resolve`), so a missing column or a reference of another
    label count or input size fails before any training time is spent."""

    def __init__(self, source: IrreducibleLosses | torch.nn.Module, name: str, loss_fn=None):
        self.source = source
        self.name = name  # how errors name the reference
        # A loss the user wrote scores the reference too: both sides of the reducible loss must be one kind.
        self.loss_fn = loss_fn
        self.scored: ReferencePass | None = None

    @classmethod
    def resolve(cls, trainer, reference_model: torch.nn.Module | None, loss_fn=None):
        """The reference of ``trainer``'s run, and its training dataset (without the column of irreducible losses,
        which the model must not receive as an input when remove_unused_columns is off)."""
        args, dataset = trainer.args, trainer.train_dataset
        if reference_model is not None and args.sb_reference_model is not None:
            raise ValueError("both reference_model= and --sb_reference_model are given; pass only one of them")
        path = args.sb_reference_model
        name = f"{MODEL_FLAG} {path!r}" if path is not None else "reference_model"
        if args.sb_reference_column is not None:
            if streams.is_stream(dataset):  # read once, two columns only
                pairs = streams.column_pairs(dataset, args.sb_reference_column, args.sb_index_column,
                                             trainer.accelerator)
                table = IrreducibleLosses.from_pairs(*pairs)
            else:
                table = from_column(dataset, args.sb_reference_column, ids_by_position(dataset, args.sb_index_column))
            return cls(table, name, loss_fn), dataset.remove_columns(args.sb_reference_column)
        if path is not None:
            reference_model = load_reference_model(path)
        if reference_model is None:
            raise ValueError(
                "--sb_strategy rholoss selects by loss minus irreducible loss: pass --sb_reference_model (a folder "
                "holding a model trained on held-out data), --sb_reference_column (a column of irreducible losses), "
                "or SelectiveBackpropTrainer(reference_model=...)"
            )
        check_fits(reference_model, trainer.accelerator.unwrap_model(trainer.model), name)
        return cls(reference_model, name, loss_fn), dataset

    def irreducible_losses(self, trainer, resuming: bool) -> ReferencePass | None:
        """The table and what it cost: a column's (nothing), or scored once by the reference model, or (resuming)
        None until the checkpoint restores the saved one. A collective when it scores."""
        if resuming:
            return None
        if isinstance(self.source, IrreducibleLosses):
            return ReferencePass(self.source, forwards=0, seconds=0.0)
        if self.scored is None:  # an auto_find_batch_size restart keeps the first pass
            self.scored = compute(trainer, self.source, self.name, self.loss_fn)
            ids = ids_by_position(trainer.train_dataset, trainer.args.sb_index_column)  # None for a stream: its pass
            if ids is not None:  # read every row the run reads
                self.scored.table.check_covers(ids, self.name)
        return self.scored


def refuse_unused(reference_model: torch.nn.Module | None, selector, strategy: str) -> None:
    """A reference model given to a strategy that does not read irreducible losses is a mistake, not a no-op."""
    if reference_model is not None and (selector is None or not selector.uses_reference_losses):
        raise ValueError(
            f"reference_model gives irreducible losses, which only sb_strategy='rholoss' uses (this run has "
            f"{strategy!r})"
        )


def from_column(dataset, column: str, ids: torch.Tensor) -> IrreducibleLosses:
    """Irreducible losses held in ``column`` of a `datasets.Dataset`, one per row, keyed by ``ids``."""
    names = getattr(dataset, "column_names", None)
    if names is None:
        raise ValueError(
            f"{COLUMN_FLAG} {column!r} needs a datasets.Dataset training set (this one is "
            f"{type(dataset).__name__}); pass --sb_reference_model instead, or a datasets.Dataset"
        )
    if column not in names:
        raise ValueError(f"{COLUMN_FLAG} {column!r} is not a column of the training dataset; its columns: {names}")
    values = dataset.with_format("arrow")[column]
    if values.null_count:
        rows = [i for i, value in enumerate(values.to_pylist()) if value is None][:5]
        raise ValueError(f"{COLUMN_FLAG} {column!r}: no value at row(s) {rows}; every row needs its irreducible loss")
    try:
        losses = torch.as_tensor(values.to_numpy(zero_copy_only=False).astype("float32"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{COLUMN_FLAG} {column!r} must hold one float per row, got {values.type}") from error
    if losses.ndim != 1:
        raise ValueError(f"{COLUMN_FLAG} {column!r} must hold one float per row, got shape {tuple(losses.shape)}")
    bad = ~torch.isfinite(losses)
    if bool(bad.any()):
        rows = bad.nonzero().squeeze(1)[:5].tolist()
        raise ValueError(
            f"{COLUMN_FLAG} {column!r} holds NaN or inf at row(s) {rows}; irreducible losses must be finite"
        )
    return IrreducibleLosses.from_pairs(ids, losses)


def load_reference_model(path: str) -> torch.nn.Module:
    """The model saved in ``path`` (a ``save_pretrained`` folder), by the architecture its config names."""
    import transformers

    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ValueError(
            f"{MODEL_FLAG} {path!r} has no config.json: it is not a folder save_pretrained wrote; pass the "
            "reference run's --output_dir (or one of its checkpoint-N folders)"
        )
    with open(config_file) as handle:
        architectures = json.load(handle).get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        raise ValueError(
            f"{MODEL_FLAG} {path!r}: its config names architecture {architectures[:1] or 'none'}, which "
            "transformers does not provide; load the model yourself and pass "
            "SelectiveBackpropTrainer(reference_model=...)"
        )
    with _compat.whole_weights():  # each rank holds the whole reference, under a ZeRO-3 config too
        return model_class.from_pretrained(path)


def check_fits(reference: torch.nn.Module, model: torch.nn.Module, source: str) -> None:
    """Refuse a reference model of another label count or input size before anything runs."""
    ours, theirs = getattr(model, "config", None), getattr(reference, "config", None)
    if ours is None or theirs is None:
        return  # plain modules: the first batch's logits are compared in `compute`
    kind = _classifier_kind(model)
    if kind is not None and _classifier_kind(reference) != kind:
        # A language model's config has a num_labels too (2 by default): its label count says nothing.
        what = _classifier_kind(reference) or TASK_KINDS[model_task(reference)]
        raise ValueError(
            f"{source} is not {kind}: it is {what} ({type(reference).__name__}); the reference must be a model of the "
            "same task, trained on the same labels (e.g. the --output_dir of a run of the same script)"
        )
    if getattr(ours, "num_labels", None) != getattr(theirs, "num_labels", None) and _is_classifier(model):
        raise ValueError(
            f"{source} has {theirs.num_labels} labels and the model being trained {ours.num_labels}: the reference "
            "must be trained on the same labels"
        )
    size = _input_size(ours), _input_size(theirs)
    if None not in size and size[0] != size[1]:
        raise ValueError(
            f"{source} was built for inputs of size {size[1]} and the model being trained for {size[0]}: train the "
            "reference on images of the training size"
        )


#: Classifier heads by the ending of their class name, and what they are called in a message.
CLASSIFIER_KINDS = {"ForImageClassification": "an image classifier", "ForSequenceClassification": "a text classifier"}
#: Other models, by `model_task`.
TASK_KINDS = {"causal-lm": "a causal language model", "seq2seq-lm": "a sequence-to-sequence model",
              "token-classification": "a token classifier", "classification": "no classifier of this kind"}


def _classifier_kind(model) -> str | None:
    name = type(model).__name__
    return next((kind for ending, kind in CLASSIFIER_KINDS.items() if name.endswith(ending)), None)


def _is_classifier(model) -> bool:
    return _classifier_kind(model) is not None


def _input_size(config) -> tuple | None:
    pretrained = getattr(config, "pretrained_cfg", None) or {}
    size = pretrained.get("input_size") if isinstance(pretrained, dict) else None
    return tuple(size) if size is not None else None


def unaugmented(dataset):
    """``dataset`` as evaluation sees it: an image dataset's copy without random augmentation."""
    if isinstance(dataset, IndexedDataset):
        return IndexedDataset(unaugmented(dataset.dataset), dataset.column)
    view = getattr(dataset, "without_augmentation", None)
    return view() if callable(view) else dataset


def compute(trainer, reference: torch.nn.Module, source: str, loss_fn=None) -> ReferencePass:
    """Score every training example once with ``reference`` (a collective: call on every process).

    ``loss_fn`` is the trainer's ``per_example_loss_func`` when the user gave one, else the automatic
    per-example loss of the reference model is used.

    Runs inside `torch.random.fork_rng`, so the main run draws the same random numbers (data
    order, dropout) as without the pass.
    """
    args, accelerator = trainer.args, trainer.accelerator
    column = args.sb_index_column
    if loss_fn is None:
        loss_fn = per_example_loss_for(reference, label_smoothing=_smoothing(trainer), label_name=trainer.label_name)
    scorer = SelectionScorer(loss_fn, label_name=trainer.label_name, mode="eval")
    reference = reference.to(args.device)
    dataset = trainer.train_dataset
    with streams.own_share(accelerator, dataset):  # one pass of a stream: each rank its share, or dispatched
        loader = _loader(trainer, unaugmented(dataset))
    ids, losses, forwards, scored = [], [], 0, _FirstScored()
    start = time.perf_counter()
    devices = [args.device] if args.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        batches = iter(tqdm(loader, desc="Reference losses", disable=not args.should_log or args.disable_tqdm))
        while True:
            batch = next(batches, None)
            # Ranks' shares end at different batches (a stream's, or map-style data with even_batches=False): a
            # rank that is done joins the others' gathers with no rows, until every rank is done.
            if distributed.all_true(accelerator, batch is None):
                break
            failure = None
            if batch is None:
                batch_ids, batch_losses = torch.zeros(0, dtype=torch.int64), torch.zeros(0)
            else:
                batch = dict(batch)
                batch_ids = batch.pop(column)
                try:
                    if forwards == 0:
                        _check_first_batch(trainer, reference, batch, source)
                    batch_losses = _score(scorer, reference, batch, source)
                except ValueError as error:  # this rank's rows only: the gather makes every rank raise it
                    failure = naming_examples(error, batch_ids, column)
                    batch_losses = torch.full((len(batch_ids),), float("nan"))
            all_ids, all_losses, own = distributed.gather_pairs(accelerator, batch_ids, batch_losses, failure)
            # A row the sampler repeated to even out the ranks' last batches is counted once, by its first scorer.
            forwards += int(scored.first(all_ids)[own].sum())
            ids.append(all_ids.cpu())
            losses.append(all_losses.cpu())
    table = IrreducibleLosses.from_pairs(torch.cat(ids), torch.cat(losses))
    return ReferencePass(table, forwards, time.perf_counter() - start)


class _FirstScored:
    """Which of the ids every rank gathers, in the same order, are scored for the first time in the pass."""

    def __init__(self):
        self.seen = torch.zeros(0, dtype=torch.bool)

    def first(self, ids: torch.Tensor) -> torch.Tensor:
        """A mask of ``ids``: True where the id was neither gathered before nor earlier in ``ids``."""
        if not ids.numel():
            return torch.zeros(0, dtype=torch.bool)
        if int(ids.max()) >= len(self.seen):
            self.seen = torch.cat([self.seen, self.seen.new_zeros(int(ids.max()) + 1 - len(self.seen))])
        unique, inverse = torch.unique(ids, return_inverse=True)
        positions = torch.arange(len(ids))
        earliest = torch.full((len(unique),), len(ids)).scatter_reduce(0, inverse, positions, "amin")
        mask = torch.zeros(len(ids), dtype=torch.bool)
        mask[earliest] = True
        mask &= ~self.seen[ids]
        self.seen[ids] = True
        return mask


def _smoothing(trainer) -> float:
    # The reducible loss subtracts two losses of one kind: the reference's gets the training loss's smoothing.
    return trainer.label_smoother.epsilon if trainer.label_smoother is not None else 0.0


def _loader(trainer, dataset) -> DataLoader:
    # Not get_eval_dataloader: it would cache this loader as the evaluation one (persistent workers) and
    # honour dataloader_drop_last, leaving the dropped rows without an irreducible loss.
    description = "Reference losses"
    collator = trainer.data_collator
    if hasattr(dataset, "column_names") and not streams.is_stream(dataset):  # a stream: as its training loader does
        dataset = _compat.remove_unused_columns(trainer, dataset, description)
    else:
        collator = _compat.collator_with_removed_columns(trainer, collator, description)
    loader = DataLoader(
        dataset,
        batch_size=trainer.args.eval_batch_size,
        # As the training loader collates: TRL's collator drops the id column the table is keyed by.
        collate_fn=keeping_ids(collator, trainer.args.sb_index_column),
        num_workers=trainer.args.dataloader_num_workers,
        pin_memory=trainer.args.dataloader_pin_memory,
    )
    return trainer.accelerator.prepare(loader)


def _check_first_batch(trainer, reference: torch.nn.Module, batch: dict, source: str) -> None:
    """The reference's outputs must have the trained model's shape (a plain module has no config to compare).

    Skipped, with the reason in the log, while the trained model cannot run on the batch's device: DeepSpeed
    and FSDP place it when training starts, after this pass."""
    inputs = {k: v for k, v in batch.items() if k != trainer.label_name}
    model = trainer.model
    unplaced = distributed.why_unplaced(model, next(iter(inputs.values())).device)
    if unplaced is not None:
        logger.warning("%s: its logits are not compared with those of the model being trained before scoring: %s",
                       source, unplaced)
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            expected = logits_of(model(**inputs)).shape[1:]
            got = logits_of(_forward(reference, inputs, source)).shape[1:]
    finally:
        model.train(was_training)
    if expected != got:
        raise ValueError(
            f"{source} outputs logits of shape {tuple(got)} per example and the model being trained {tuple(expected)}: "
            "the reference must predict the same labels from the same inputs"
        )


def _forward(reference: torch.nn.Module, inputs: dict, source: str):
    reference.eval()
    try:
        return reference(**inputs)
    except (RuntimeError, AssertionError, TypeError) as error:
        raise ValueError(
            f"{source} cannot take the training inputs ({type(error).__name__}: {error}); the reference must take "
            "the same inputs (image size, channels, tokenizer) as the model being trained"
        ) from error


def _score(scorer: SelectionScorer, reference: torch.nn.Module, batch: dict, source: str) -> torch.Tensor:
    try:
        return scorer(reference, batch)
    except (RuntimeError, AssertionError) as error:
        raise ValueError(f"{source} failed on the training inputs ({type(error).__name__}: {error})") from error
