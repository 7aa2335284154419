"""What a run is, recorded in each checkpoint and compared when a run resumes from it.

The selection settings (every ``sb_*`` flag but those that only change how fast selection runs),
the seeds (each epoch's order and its decisions made before loading are drawn from them) and the
training data (its size and a fingerprint) must match: the saved loss history, store, queue and
position in the epoch belong to them, so a resume with others is refused before any step. Other
training settings may change; one warning lists them. Another number of processes is handled,
with its own warning, in `state_files`.

The model is recorded too: its own config (class, architecture, sizes, vocabulary, label count) and
the command-line flags that built it, where a script gives them (``model_flags``). A resume with another
model is refused naming what differs, before the weights are loaded (`check_model`) and, in the
scripts, before any data is (`check_model_flags`).

A run without selection has no ``sb_state.pt``: its record (`PlainRunSignature`: its budget and model flags) rides
in ``trainer_state.json``, and a resume with another budget or other model flags is refused the same way.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import os
import warnings

import torch
from datasets import Dataset as HFDataset
from torch.utils.data import IterableDataset
from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import CONFIG_NAME

from ..losses import model_task
from .checkpoints import STATE_FILE, require_intact_selection_state
from .indexing import IndexedDataset

#: ``sb_*`` flags that decide nothing: the size of a selection forward (a resumed epoch skips rows,
#: not batches) and how it runs or is timed.
SPEED_ONLY = ("sb_selection_batch_size", "sb_selection_inference_mode", "sb_selection_channels_last", "sb_sync_timers")
#: ``sb_*`` flags of a by-product that selection never reads: the example record may be turned on or off on resume.
BY_PRODUCTS = ("sb_record",)
SEEDS = ("seed", "data_seed")
#: Settings a resumed run may change.
TRAINING = (
    "per_device_train_batch_size", "gradient_accumulation_steps", *SPEED_ONLY, "learning_rate", "weight_decay",
    "num_train_epochs", "max_steps", "logging_strategy", "logging_steps", "eval_strategy", "eval_steps",
    "save_strategy", "save_steps", "save_total_limit", "dataloader_num_workers", *BY_PRODUCTS,
)  # fmt: skip
#: Changes that do not take effect, and why.
KEPT_FROM_CHECKPOINT = {
    "learning_rate": "the optimizer and learning-rate scheduler restored from the checkpoint keep the saved one",
    "weight_decay": "the optimizer restored from the checkpoint keeps the saved one",
}
#: The full run a budget (``--sb_budget``) is a share of: a budget run resumed with others would keep the saved plan
#: (or, without selection, change length and jump in its learning-rate schedule), so they cannot change.
BUDGET_LENGTH = ("num_train_epochs", "max_steps")
BUDGET_NOTE = " (with --sb_budget: the full run whose cost the budget is a share of)"
#: Rows of a `datasets.Dataset` hashed into its fingerprint, evenly spaced.
ROWS_HASHED = 64
#: Flags that set one another (for 'sb', ``--sb_beta 2`` is the default ``--sb_keep``): the strategy's own one
#: (`OWN_KEEP_FLAG`, else sb_keep) is recorded as the value in effect, the others as None, so the same setting
#: given either way compares equal.
IN_EFFECT = {"sb_keep": "sb_keep_fraction", "sb_beta": "sb_beta_value", "sb_presample": "sb_presample_value"}
OWN_KEEP_FLAG = {"sb": "sb_beta", "kath18": "sb_presample"}
#: Fields of the model's config that its weights' shapes and meaning depend on (BERT-style and GPT-2-style
#: names, timm's architecture); num_labels for classifiers only (a language model's is a config default).
MODEL_FIELDS = (
    "model_type", "architecture", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "n_embd", "n_layer", "n_head", "n_inner",
)  # fmt: skip


def describe(args, dataset, model: torch.nn.Module | None = None, model_flags: dict | None = None) -> dict:
    """The record a checkpoint keeps of the run: ``args`` a `SelectiveBackpropConfig`, ``dataset`` the training
    data, ``model`` the (unwrapped) model, ``model_flags`` the flags a script built it from."""
    selection = [f.name for f in dataclasses.fields(args)
                 if f.name.startswith("sb_") and f.name not in (*SPEED_ONLY, *BY_PRODUCTS)]
    return {
        "selection": {name: _plain(_in_effect(args, name)) for name in [*selection, *SEEDS]},
        "training": {name: _plain(getattr(args, name)) for name in TRAINING},
        "dataset": dataset_fingerprint(dataset),
        "augmentation": _augmentation(dataset),
        "model": describe_model(model) if model is not None else None,
        "model_flags": {flag: _plain(value) for flag, value in (model_flags or {}).items()},
    }


def describe_model(model: torch.nn.Module) -> dict:
    """The model's class and the `MODEL_FIELDS` its config holds (a model without a config: its class)."""
    from transformers.trainer_utils import unwrap_peft_model

    base = unwrap_peft_model(model)
    record = {"class": type(base).__name__}
    config = getattr(base, "config", None)
    if config is None:
        return record
    for name in MODEL_FIELDS:
        value = getattr(config, name, None)
        if value is not None:
            record[name] = _plain(value)
    if model_task(base) == "classification" and getattr(config, "num_labels", None) is not None:
        record["num_labels"] = config.num_labels
    return record


class PlainRunSignature(TrainerCallback, ExportableState):
    """The record of a run without selection (``--sb_strategy none``, or a plain `Trainer`), whose checkpoints hold no
    ``sb_state.pt``: its budget (``--sb_budget`` and the full run it is a share of) and the flags that built its
    model, where a script gives them. It rides in each checkpoint's ``trainer_state.json``, in
    ``stateful_callbacks`` (where the Trainer keeps EarlyStoppingCallback's state); a run with neither adds none,
    and its checkpoints are the Trainer's own."""

    def __init__(self, budget: dict | None = None, model_flags: dict | None = None):
        self.budget, self.model_flags = budget, model_flags

    def state(self) -> dict:
        return {"args": {"budget": self.budget, "model_flags": self.model_flags}, "attributes": {}}

    def on_train_begin(self, args, state, control, **kwargs):
        # The Trainer indexes this entry when it saves; a resumed state without it (an older checkpoint) would fail.
        state.stateful_callbacks[type(self).__name__] = self.state()

    @classmethod
    def of(cls, args, model_flags: dict | None = None) -> PlainRunSignature | None:
        """The record of a run of ``args`` whose model ``model_flags`` built; None when it has nothing to record."""
        budget = _budget_settings(args)
        if budget is None and not model_flags:
            return None
        return cls(budget, {flag: _plain(value) for flag, value in (model_flags or {}).items()})

    @classmethod
    def attach(cls, trainer) -> None:
        """Give a `SelectiveBackpropTrainer` without selection its record, in place of an earlier train() call's."""
        if trainer.selector is None:
            trainer.remove_callback(cls)
            record = cls.of(trainer.args, trainer.model_flags)
            if record is not None:
                trainer.add_callback(record)

    @classmethod
    def saved(cls, checkpoint: str) -> dict | None:
        """The record ``checkpoint`` holds, as ``{"budget": ..., "model_flags": ...}``; None if it holds none."""
        try:
            with open(os.path.join(checkpoint, TRAINER_STATE_NAME)) as handle:
                entry = (json.load(handle).get("stateful_callbacks") or {}).get(cls.__name__)
        except (OSError, ValueError):
            return None
        return entry.get("args") if isinstance(entry, dict) else None


def _budget_length_differences(saved: dict, now: dict) -> list[str]:
    """One line per setting of the full run a budget is a share of that differs between ``saved`` and ``now``."""
    return [f"--{name}: saved {saved.get(name)!r}, now {now[name]!r}{BUDGET_NOTE}"
            for name in BUDGET_LENGTH if saved.get(name) != now[name]]


def _budget_settings(args) -> dict | None:
    if getattr(args, "sb_budget", None) is None:
        return None
    return {"sb_budget": args.sb_budget, **{name: _plain(getattr(args, name)) for name in BUDGET_LENGTH}}


def saved_record(checkpoint: str) -> dict | None:
    """The run signature a checkpoint holds: a selective run's (sb_state.pt), or a run without selection's
    `PlainRunSignature` (its ``model_flags`` and ``budget``); None for another checkpoint (or an older one)."""
    path = os.path.join(checkpoint, STATE_FILE)
    if os.path.isfile(path):
        return torch.load(path, weights_only=True).get("run")
    return PlainRunSignature.saved(checkpoint)


def check_model(checkpoint: str, model: torch.nn.Module) -> None:
    """Refuse to load ``checkpoint``'s weights into another model: a raw size mismatch, or a silently other model.
    A checkpoint without the record (a run without selection's, or an earlier version's) is compared through the
    config.json saved with its weights."""
    saved = (saved_record(checkpoint) or {}).get("model") or _saved_config(checkpoint)
    if not saved:
        return
    current = describe_model(model)
    wrong = [f"the model's {name}: saved {saved[name]!r}, now {current[name]!r}"
             for name in saved if name in current and saved[name] != current[name]]
    if wrong:
        raise ValueError(
            f"Cannot resume from {checkpoint}: this run's model differs from the saved one:\n  " + "\n  ".join(wrong)
            + "\nThe checkpoint's weights and optimizer state fit the saved model. Resume with a model built as the "
            f"saved one (its config.json is in {checkpoint}), or start a new run without resume_from_checkpoint."
        )


def _saved_config(checkpoint: str) -> dict | None:
    """`describe_model`'s fields as the checkpoint's config.json holds them; None without one."""
    try:
        with open(os.path.join(checkpoint, CONFIG_NAME)) as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    saved = {name: _plain(config[name]) for name in MODEL_FIELDS if config.get(name) is not None}
    if isinstance(config.get("architectures"), list) and len(config["architectures"]) == 1:
        saved["class"] = config["architectures"][0]
    if isinstance(config.get("id2label"), dict):
        saved["num_labels"] = len(config["id2label"])  # compared for a classifier only (describe_model)
    return saved


def check_model_flags(checkpoint: str | None, flags: dict) -> None:
    """Refuse, before any data is loaded, a resume whose model flags differ from those the saved run recorded."""
    saved = (saved_record(checkpoint) or {}).get("model_flags") if checkpoint else None
    if not saved:
        return
    wrong = [f"{flag}: saved {saved[flag]!r}, now {_plain(value)!r}"
             for flag, value in flags.items() if flag in saved and saved[flag] != _plain(value)]
    if wrong:
        raise ValueError(
            f"Cannot resume from {checkpoint}: the model flags differ from the saved run's:\n  " + "\n  ".join(wrong)
            + "\nThe checkpoint's weights and optimizer state fit the saved model: resume with the saved values, or "
            "start a new run (drop --resume_from_checkpoint; --overwrite_output_dir to reuse this --output_dir)."
        )


def _in_effect(args, name: str):
    if name not in IN_EFFECT:
        return getattr(args, name)
    return getattr(args, IN_EFFECT[name]) if name == OWN_KEEP_FLAG.get(args.sb_strategy, "sb_keep") else None


def _augmentation(dataset) -> dict | None:
    """The training data's augmentation settings, if it says (`ImageTensorDataset.augmentation`)."""
    inner = dataset.dataset if isinstance(dataset, IndexedDataset) else dataset
    settings = getattr(inner, "augmentation", None)
    return settings() if callable(settings) else None


def _plain(value):
    # Only plain values: checkpoints are read with torch.load(weights_only=True).
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return str.__str__(value)  # a str subclass (the default strategy's DefaultChoice) as the plain string
    return value if isinstance(value, (bool, int, float, type(None))) else str(value)


def dataset_fingerprint(dataset) -> dict:
    """``size`` and ``hash`` of the training data; None where they cannot be known (a stream).

    A `datasets.Dataset` hashes its stored values at `ROWS_HASHED` evenly spaced rows (ids included);
    a torch dataset with a ``fingerprint()`` method gives its own (`ImageTensorDataset`); any other
    is compared by size only, since reading its rows may augment them at random.
    """
    if isinstance(dataset, IterableDataset):
        return {"size": None, "hash": None}
    inner = dataset.dataset if isinstance(dataset, IndexedDataset) else dataset
    digest = None
    if isinstance(inner, HFDataset):
        positions = torch.linspace(0, len(inner) - 1, min(len(inner), ROWS_HASHED)).long().tolist()
        rows = inner.with_format("arrow")[positions]  # as stored: no formatting or transform applied
        digest = hashlib.sha256(repr(rows.to_pydict()).encode()).hexdigest()
    elif callable(getattr(inner, "fingerprint", None)):
        digest = inner.fingerprint()
    return {"size": len(dataset), "hash": digest}


def check(saved: dict | None, current: dict, checkpoint: str) -> None:
    """Refuse what cannot continue the saved run (ValueError); warn once about settings that changed."""
    if saved is None:
        warnings.warn(
            f"{checkpoint} does not record the settings and data of the run that saved it (an earlier version "
            "wrote it), so they cannot be checked against this run's: resume with the same ones.",
            stacklevel=3,
        )
        return
    wrong = [
        f"--{name}: saved {saved['selection'][name]!r}, now {value!r}"
        for name, value in current["selection"].items()
        # A flag the strategy does not use is None; an earlier version recorded it as given, None if derived.
        if name in saved["selection"] and not (name in IN_EFFECT and None in (saved["selection"][name], value))
        and not _same(saved["selection"][name], value)
    ]
    before, now = saved.get("augmentation"), current.get("augmentation")
    if before is not None and now is not None:
        wrong += [f"--{name}: saved {before.get(name)!r}, now {now.get(name)!r}"
                  for name in sorted(before.keys() | now.keys()) if before.get(name) != now.get(name)]
    data = _data_difference(saved["dataset"], current["dataset"])
    if data:
        wrong.append(data)
    if saved["selection"].get("sb_budget") is not None and current["selection"].get("sb_budget") is not None:
        wrong += _budget_length_differences(saved["training"], current["training"])
    if wrong:
        _refuse(checkpoint, wrong)
    changed = []
    for name, value in current["training"].items():
        if name in saved["training"] and saved["training"][name] != value:
            note = f" (no effect: {KEPT_FROM_CHECKPOINT[name]})" if name in KEPT_FROM_CHECKPOINT else ""
            changed.append(f"{name}: saved {saved['training'][name]!r}, now {value!r}{note}")
    if changed:
        warnings.warn(
            f"Resuming from {checkpoint} with training settings that differ from the saved run's: "
            + "; ".join(changed)
            + ". The run continues with the new values from here on.",
            stacklevel=3,
        )


def check_without_selection(checkpoint: str | bool, args) -> str | None:
    """Refuse what a run without selection (``args``) cannot continue: a selective run's checkpoint (the plain
    Trainer would skip batches by its step count, not the rows selection read), or one of another budget (the
    share of the full run's steps its learning-rate schedule spans). ``True`` is the Trainer's last checkpoint.
    Returns the checkpoint checked (None: none to resume from)."""
    if checkpoint is True:
        checkpoint = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    if not checkpoint:
        return None
    path = os.path.join(checkpoint, STATE_FILE)
    if os.path.isfile(path):
        saved = torch.load(path, weights_only=True).get("run")
        strategy = repr(saved["selection"]["sb_strategy"]) if saved else "a selective strategy"
        _refuse(checkpoint, [f"--sb_strategy: saved {strategy}, now 'none'"])
    require_intact_selection_state(checkpoint)  # one without its sb_state.pt: damaged, and a selective run's
    saved, now = (PlainRunSignature.saved(checkpoint) or {}).get("budget") or {}, _budget_settings(args) or {}
    wrong = []
    if not _same(saved.get("sb_budget"), now.get("sb_budget")):
        wrong.append(f"--sb_budget: saved {saved.get('sb_budget')!r}, now {now.get('sb_budget')!r}")
    elif saved and now:
        wrong += _budget_length_differences(saved, now)
    if wrong:
        raise ValueError(
            f"Cannot resume from {checkpoint}: this run's budget differs from the saved run's:\n  " + "\n  ".join(wrong)
            + "\nWithout selection, --sb_budget F takes F of the full run's optimizer steps, over which the "
            "learning-rate schedule restored from the checkpoint runs: resume with the saved values, or start a new "
            f"run from the checkpoint's weights (load the model from {checkpoint}, e.g. with from_pretrained, and "
            "train without resume_from_checkpoint)."
        )
    return checkpoint


def _same(saved, value) -> bool:
    # Derived values are computed (1/(beta+1), 1/keep - 1): equal settings may differ in the last bit.
    if isinstance(saved, float) and isinstance(value, float):
        return math.isclose(saved, value, rel_tol=1e-9)
    return saved == value


def _refuse(checkpoint: str, differences: list[str]) -> None:
    raise ValueError(
        f"Cannot resume from {checkpoint}: this run differs from the saved one in what selection depends on:\n  "
        + "\n  ".join(differences)
        + "\nThe saved loss history, loss store, queued rows and position in the epoch belong to the saved "
        "settings and data. Resume with the saved values, or start a new run from the checkpoint's weights "
        f"(load the model from {checkpoint}, e.g. with from_pretrained, and train without resume_from_checkpoint)."
    )


def _data_difference(saved: dict, current: dict) -> str | None:
    if None not in (saved["size"], current["size"]) and saved["size"] != current["size"]:
        return f"training dataset: saved {saved['size']} examples, now {current['size']}"
    if None not in (saved["hash"], current["hash"]) and saved["hash"] != current["hash"]:
        return (
            f"training dataset: saved data with fingerprint {saved['hash'][:12]}, now {current['hash'][:12]} "
            f"(the same size, {current['size']} examples, but other examples)"
        )
    return None
