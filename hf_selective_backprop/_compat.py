"""Every use of the Trainer beyond its public API, in one place (as TRL keeps its own in ``trl/_compat.py``).

Selection changes what a step trains on, which the Trainer's public hooks (``get_train_dataloader``,
``get_batch_samples``, ``compute_loss``, callbacks) do not fully reach. Where the package needs more, the
access is here, or, for a hook it overrides (an override keeps its name), listed here; `PRIVATE_SURFACE`
says for each private name why it is needed and which public hook would make it unnecessary. Only
``trainer.py`` (the overrides) and this module name the Trainer's private members
(``tests/test_compat.py`` checks it), so a transformers release that changes them is adapted to here.

Beside the private names: the seven values ``set_initial_training_values`` returns, which the loop unpacks
by position, are read and returned by name (`TrainingValues`, their count checked), and four public
attributes are used in a way the Trainer does not document: the scheduler's ``lr_lambdas``
(`map_lr_lambdas`), the ``DefaultFlowCallback`` swap (`replace_default_flow`), ``args.save_total_limit``
hidden during saves (`save_total_limit_hidden`, `hide_save_total_limit`) and the progress bar's total
(`set_progress_total`).
How ``compute_loss`` scales the loss over processes is mirrored by `TRAINER_LOSS_SCALE` and
`SFT_LOSS_SCALE`, each checked against the upstream ``compute_loss`` when a trainer is built.

Supported transformers releases: 5.17 and newer (``pyproject.toml``); the newest the suite ran against is
`NEWEST_TESTED`'s, and a newer one gets one warning (`warn_if_newer_than_tested`), not a refusal. Every hook
listed below exists with the same signature from 5.3 on; the differences the package meets there are
`TRAINER_SCALE_DIVIDES_TP` (5.19) and `TRAINER_RESUMES_CPU_PROCESSES` (5.18). What stops the range lower, release
by release, is in docs/usage.md ("Supported versions").
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
import transformers
from packaging.version import InvalidVersion, Version

#: The newest transformers and TRL releases the suite was run against: `make test` pins them (the Makefile's
#: NEWEST_PINS; tests/test_packaging.py checks that the two agree). The requirements set no upper bound, so that
#: installing this package never downgrades either; a newer release may have changed the private surface below.
NEWEST_TESTED = {"transformers": Version("5.24.0"), "trl": Version("1.16.0")}


def warn_if_newer_than_tested(distribution: str, installed: str) -> Version:
    """Warn when ``installed``, the release of ``distribution`` (a `NEWEST_TESTED` key) that this process imported,
    is newer than the newest the suite was run against. Called once, where the package imports it. Returns the
    release; a version string that is not one (a build that rewrote it) is taken for the newest tested, with a
    warning, rather than stopping the import."""
    newest = NEWEST_TESTED[distribution]
    try:
        release = Version(installed)
    except InvalidVersion:
        warnings.warn(
            f"{distribution} gives its version as {installed!r}, which is not a version number: hf-selective-backprop "
            f"takes it for {newest}, the newest release it was tested with. If a run fails or behaves differently, "
            f"`pip install {distribution}=={newest}`.",
            UserWarning,
            stacklevel=2,
        )
        return newest
    if release > newest:
        warnings.warn(
            f"{distribution} {installed} is newer than the newest release hf-selective-backprop was tested with "
            f"({newest}): the Trainer hooks it builds on may have changed. If a run fails or behaves differently, "
            f"`pip install {distribution}=={newest}`.",
            UserWarning,
            stacklevel=2,
        )
    return release


#: The installed transformers release, for the differences below that are named by the release that made them.
TRANSFORMERS_VERSION = warn_if_newer_than_tested("transformers", transformers.__version__)
#: transformers 5.19 stopped counting tensor-parallel ranks as data-parallel processes in compute_loss's scale.
TRAINER_SCALE_DIVIDES_TP = TRANSFORMERS_VERSION >= Version("5.19.0")
#: Before 5.18 the Trainer reloads a multi-process CPU run's optimizer onto ``cpu:0``, which torch.load refuses:
#: such a resume fails in the Trainer itself, with or without selection (the suite skips those tests there).
TRAINER_RESUMES_CPU_PROCESSES = TRANSFORMERS_VERSION >= Version("5.18.0")

#: Each private member of transformers' Trainer the package uses: (why, the public hook that would replace it).
PRIVATE_SURFACE: dict[str, tuple[str, str]] = {
    # ---- overridden, in trainer.py ----
    "_inner_training_loop": (
        "builds a fresh engine (and scores the RHO-LOSS reference) at each start, auto_find_batch_size restarts "
        "included, before the loop reads the data",
        "an on_train_begin callback that runs before the dataloader is built and sees the batch size",
    ),
    "_init_training_state": (
        "restores the engine from a checkpoint and returns the Trainer's epoch without its batch skip: selection "
        "makes the batches per step vary, so the sampler skips the rows already read instead",
        "a resume hook that lets a sampler own the skip (as Accelerate's stateful dataloaders do)",
    ),
    "_get_train_sampler": (
        "wraps the Trainer's (seeded) sampler in PlannedSampler, which loads only the rows an epoch's plan trains",
        "a public get_train_sampler",
    ),
    "_set_signature_columns_if_needed": (
        "keeps the id column when remove_unused_columns drops the columns the model's forward does not take",
        "a public list of extra columns to keep (like label_names)",
    ),
    "_signature_columns": (
        "the list that override appends the id column to (add_signature_column)",
        "as for _set_signature_columns_if_needed",
    ),
    "_save_checkpoint": (
        "writes the engine's state into the checkpoint before trainer_state.json, and rotates only the run's own "
        "checkpoints (engine/rotation.py)",
        "a save hook that can add files to a checkpoint folder, and rotation limited to the run's checkpoints",
    ),
    "_load_best_model": (
        "with save_total_limit=1 the Trainer then deletes every checkpoint-* folder but the best: rotate the run's "
        "own first and hide the limit (engine/rotation.py)",
        "as for _save_checkpoint",
    ),
    # ---- called, through the functions below ----
    "_get_dataloader": (
        "builds the training loader at the selection batch size with the Trainer's own workers, seeding and "
        "Accelerate preparation (dataloader)",
        "a batch_size argument to get_train_dataloader",
    ),
    "_remove_unused_columns": (
        "drops the columns the model does not take from the rows the construction check and the RHO-LOSS reference "
        "pass collate themselves (remove_unused_columns)",
        "a public remove_unused_columns",
    ),
    "_get_collator_with_removed_columns": (
        "the same for a dataset without column names (collator_with_removed_columns)",
        "as for _remove_unused_columns",
    ),
    "_prepare_inputs": (
        "prepares selection-forward inputs as training inputs are (device, DeepSpeed's cast) (input_preparation)",
        "a public prepare_inputs",
    ),
    "_get_num_items_in_batch": (
        "counts the label tokens of the micro-batches get_batch_samples assembles, as the Trainer counts its own "
        "(num_items_in_batch)",
        "a public helper, or get_batch_samples returning batches only",
    ),
    "_get_output_dir": (
        "the run's folder, where a checkpoint is written and rotated (output_dir)",
        "a checkpoint folder passed to a save hook",
    ),
    "_train_batch_size": (
        "the batch size of the current (auto_find_batch_size) attempt, the size of each training micro-batch "
        "(train_batch_size); set to the attempt's size before the engine is built (adopt_loop_batch_size), as the "
        "loop's own first step sets it",
        "a public attribute, or the batch size passed to the hooks that build the dataloader",
    ),
}
#: The Trainer's private names the package may use, and only in ``trainer.py`` and this module.
TRAINER_PRIVATE_NAMES = frozenset(PRIVATE_SURFACE)


# ---- data ------------------------------------------------------------------------------------------


def dataloader(trainer, dataset, description: str, batch_size: int, sampler_fn, collator):
    """The training loader of ``collator``, which ``_get_dataloader`` takes from ``trainer.data_collator``."""
    original, trainer.data_collator = trainer.data_collator, collator
    try:
        return trainer._get_dataloader(dataset, description, batch_size, sampler_fn, is_training=True)
    finally:
        trainer.data_collator = original


def remove_unused_columns(trainer, dataset, description: str):
    return trainer._remove_unused_columns(dataset, description=description)


def collator_with_removed_columns(trainer, collator, description: str):
    return trainer._get_collator_with_removed_columns(collator, description=description)


def collated_rows(trainer, dataset, count: int, description: str) -> dict:
    """The first ``count`` rows of ``dataset`` collated as the Trainer's loader collates them (the columns the
    model does not take removed), for the checks that score rows before training."""
    import datasets

    if isinstance(dataset, datasets.Dataset):
        dataset = remove_unused_columns(trainer, dataset, description)
    collator = collator_with_removed_columns(trainer, trainer.data_collator, description)
    return collator([dataset[i] for i in range(count)])


def input_preparation(trainer) -> Callable[[dict], dict]:
    return trainer._prepare_inputs


def num_items_in_batch(trainer, batches: list, device):
    return trainer._get_num_items_in_batch(batches, device)


def add_signature_column(trainer, column: str) -> None:
    """Keep ``column`` when the Trainer removes the columns the model does not take (after its own list is set)."""
    if column not in trainer._signature_columns:
        trainer._signature_columns.append(column)


def train_batch_size(trainer) -> int:
    return trainer._train_batch_size


def adopt_loop_batch_size(trainer, batch_size: int | None) -> None:
    """The batch size of the training loop about to start, set before the loop's first step sets it: under
    ``auto_find_batch_size`` each attempt's ``_inner_training_loop`` adopts the (smaller) ``batch_size`` it is
    called with as its first step, and a fresh engine must assemble micro-batches of it."""
    if trainer.args.auto_find_batch_size and batch_size is not None:
        trainer._train_batch_size = batch_size


def output_dir(trainer, trial) -> str:
    return trainer._get_output_dir(trial)


# ---- models ----------------------------------------------------------------------------------------


@contextmanager
def whole_weights():
    """Inside it, ``from_pretrained`` loads whole weights even while a DeepSpeed ZeRO-3 config is in effect.

    transformers partitions every model it loads while ``is_deepspeed_zero3_enabled()``, which reads a weak
    reference that ``TrainingArguments`` with a ZeRO-3 ``deepspeed`` config sets (the public
    ``unset_hf_deepspeed_config`` clears it; only the private reference can be read to restore it).
    """
    from transformers.integrations import deepspeed as hf_deepspeed

    reference = hf_deepspeed._hf_deepspeed_config_weak_ref
    config = reference() if reference is not None else None
    if config is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(config)


# ---- run length and schedule -----------------------------------------------------------------------


class TrainingValues(NamedTuple):
    """What ``Trainer.set_initial_training_values`` returns, by name: the loop unpacks the tuple by position,
    so the override must return these seven in this order (the public replacement: a named result)."""

    num_train_epochs: int
    num_update_steps_per_epoch: int
    num_examples: int
    num_train_samples: int
    total_train_batch_size: int
    steps_in_epoch: int | None
    max_steps: int


def training_values(values: tuple) -> TrainingValues:
    if len(values) != len(TrainingValues._fields):
        raise RuntimeError(
            f"Trainer.set_initial_training_values returned {len(values)} values where hf_selective_backprop expects "
            f"{len(TrainingValues._fields)} ({', '.join(TrainingValues._fields)}): this transformers version is not "
            "supported yet"
        )
    return TrainingValues(*values)


def map_lr_lambdas(scheduler, change: Callable[[Callable], Callable]) -> None:
    """Replace each of a `LambdaLR`'s factor functions by ``change(fn)``. The Trainer builds its schedules as
    ``LambdaLR`` (``get_scheduler``); rewriting ``lr_lambdas`` makes them follow the run's progress (and the
    step decays) without rebuilding each schedule. Public replacement: a schedule hook given the progress."""
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        scheduler.lr_lambdas = [change(fn) for fn in scheduler.lr_lambdas]


# ---- callbacks and checkpoints ---------------------------------------------------------------------


def replace_default_flow(trainer, flow_callback) -> None:
    """Put ``flow_callback`` first, in ``DefaultFlowCallback``'s place: the default flow ends an epoch-based run
    after a fixed number of steps, which selection changes. Public replacement: a flow the run can configure."""
    from transformers import DefaultFlowCallback

    trainer.remove_callback(DefaultFlowCallback)
    trainer.callback_handler.callbacks.insert(0, flow_callback)


def set_progress_total(trainer, total: int) -> None:
    """Make the training progress bar's total ``total`` steps: the bar ``ProgressCallback`` (tqdm) or
    ``NotebookProgressCallback`` opened at ``state.max_steps``, which under selection is an estimate. Public
    replacement: a progress callback that reads ``state.max_steps`` at every step."""
    for callback in trainer.callback_handler.callbacks:
        bar = getattr(callback, "training_bar", None) or getattr(callback, "training_tracker", None)
        if bar is not None and getattr(bar, "total", total) != total:
            bar.total = total
            if hasattr(bar, "refresh"):  # tqdm redraws; the notebook tracker shows the total at its next update
                bar.refresh()


@contextmanager
def save_total_limit_hidden(args):
    """Hide ``save_total_limit`` from the Trainer's own rotation, which deletes any ``checkpoint-*`` folder of
    ``output_dir``, a previous run's or a user's included. Public replacement: a rotation hook."""
    limit = args.save_total_limit
    args.save_total_limit = None
    try:
        yield
    finally:
        args.save_total_limit = limit


def hide_save_total_limit(trainer) -> None:
    """As `save_total_limit_hidden`, until `restore_save_total_limit` (``train`` returning)."""
    trainer._sb_hidden_save_total_limit = trainer.args.save_total_limit
    trainer.args.save_total_limit = None


def restore_save_total_limit(trainer) -> None:
    if hasattr(trainer, "_sb_hidden_save_total_limit"):
        trainer.args.save_total_limit = trainer._sb_hidden_save_total_limit
        del trainer._sb_hidden_save_total_limit


# ---- how compute_loss scales the loss --------------------------------------------------------------


def _trainer_factor(trainer, num_items_in_batch) -> int:
    # Transformers' Trainer.compute_loss: with a token count summed over ranks, DDP's gradient averaging is undone
    # by the number of processes (from 5.19 on, tensor-parallel ranks, which share a batch, count once), or by the
    # GPU count under DataParallel.
    if (
        trainer.args.average_tokens_across_devices
        and (trainer.model_accepts_loss_kwargs or trainer.compute_loss_func)
        and num_items_in_batch is not None
    ):
        if trainer.args.n_gpu > 1:
            return trainer.args.n_gpu
        processes = trainer.accelerator.num_processes
        return processes // trainer.get_tp_size() if TRAINER_SCALE_DIVIDES_TP else processes
    return 1


def _sft_factor(trainer, num_items_in_batch) -> int:
    # TRL's SFTTrainer.compute_loss undoes DDP's averaging whenever the token count is summed over ranks.
    if trainer.args.average_tokens_across_devices and num_items_in_batch is not None:
        return trainer.accelerator.num_processes // trainer.get_tp_size()
    return 1


class _ProbeModel:
    """A model whose loss is 1: ``{"loss": 1}`` for the Trainer, and for ``SFTTrainer``'s fused head one label
    token of log-probability -1 (one token, so normalising by ``num_items_in_batch=1`` or by the mask agree)."""

    training = False

    def __call__(self, **inputs):
        if inputs.get("fused_lm_head"):
            return SimpleNamespace(
                log_probs=torch.tensor([[-1.0]]), label_mask=torch.tensor([[True]]),
                entropy=torch.zeros(1, 1), is_top1=torch.zeros(1, 1, dtype=torch.bool), aux_loss=torch.tensor(0.0),
            )
        return {"loss": torch.tensor(1.0)}


class _ProbeTrainer:
    """The trainer as ``compute_loss`` reads it, on ``processes`` processes of ``tp_size`` tensor-parallel ranks
    each, with the probe model: attributes it does not set are read from the real trainer, and what
    ``compute_loss`` writes (TRL's metrics) lands here, not there."""

    def __init__(self, trainer, processes: int, tp_size: int):
        self._trainer = trainer
        self.accelerator = SimpleNamespace(num_processes=processes, parallelism_config=None,
                                           gather_for_metrics=lambda tensor: tensor, unwrap_model=lambda model: model)
        self.get_tp_size = lambda: tp_size
        self.model = _ProbeModel()
        has_func = trainer.compute_loss_func is not None
        self.compute_loss_func = (lambda outputs, labels, num_items_in_batch=None: torch.tensor(1.0)) if has_func \
            else None
        self.label_smoother = None  # the scale does not depend on it; a smoother would need real logits
        self.aux_loss_enabled = False  # TRL: no router loss added to the probe's
        self._metrics = defaultdict(lambda: defaultdict(list))  # TRL's logged metrics, kept off the real trainer
        self._total_train_tokens = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)


@dataclass(frozen=True)
class LossScale:
    """What an upstream ``compute_loss`` multiplies the model's loss by, for the weighted loss to match it.

    ``factor`` mirrors the rule (selection computes its own weighted loss, so it must apply the same factor);
    ``check`` runs the upstream ``compute_loss`` on a model whose loss is 1, for several process counts, and
    refuses to build a trainer whose upstream no longer agrees, rather than mis-scale its gradients silently.
    """

    name: str
    upstream: Callable[[], Callable]  # the compute_loss whose rule `factor` mirrors (imported when checked)
    factor: Callable[[Any, Any], int]

    def check(self, trainer) -> None:
        compute_loss, base = self.upstream(), None
        for processes, tp_size in ((1, 1), (6, 1), (6, 2)):
            for num_items in (None, torch.tensor(1)):
                probe = _ProbeTrainer(trainer, processes, tp_size)
                got = self._probe(compute_loss, probe, num_items, trainer.args.sb_strategy)
                # The unscaled loss is 1, or what TRL's loss_type makes of one token of log-probability -1.
                base = got if base is None else base
                expected = base * self.factor(probe, num_items)  # as compute_loss multiplies: exact
                if not torch.equal(got, expected):
                    raise RuntimeError(
                        f"{self.name} multiplies the loss by {float(got / base):g} on {processes} processes (tensor "
                        f"parallel {tp_size}, num_items_in_batch {num_items}) where hf_selective_backprop expects "
                        f"{float(expected / base):g}: this version scales the loss differently, so the weighted loss "
                        f"of --sb_strategy {trainer.args.sb_strategy} would be mis-scaled. Please report it with your "
                        "transformers and TRL versions"
                    )

    def _probe(self, compute_loss, probe: _ProbeTrainer, num_items, strategy: str) -> torch.Tensor:
        inputs = {"input_ids": torch.zeros(1, 1, dtype=torch.long), "labels": torch.zeros(1, 1, dtype=torch.long)}
        try:
            return torch.as_tensor(compute_loss(probe, probe.model, inputs, False, num_items)).detach()
        except Exception as error:  # noqa: BLE001 - whatever fails, the rule cannot be confirmed
            raise RuntimeError(
                f"hf_selective_backprop could not check how {self.name} scales the loss ({type(error).__name__}: "
                f"{error}); this version is not supported with loss weights (--sb_strategy {strategy}) yet"
            ) from error


def _trainer_compute_loss():
    from transformers import Trainer

    return Trainer.compute_loss


def _sft_compute_loss():
    from trl import SFTTrainer

    return SFTTrainer.compute_loss


TRAINER_LOSS_SCALE = LossScale("transformers' Trainer.compute_loss", _trainer_compute_loss, _trainer_factor)
SFT_LOSS_SCALE = LossScale("TRL's SFTTrainer.compute_loss", _sft_compute_loss, _sft_factor)
