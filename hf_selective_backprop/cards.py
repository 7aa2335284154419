"""Model cards the Hub way: the packaged Selective-Backprop template, rendered with `ModelCard.from_template`.

`write_trainer_card` is what `SelectiveBackpropTrainer.create_model_card` (and so `push_to_hub`)
runs: it reads the settings, savings and accuracy off the trainer. `render_model_card` serves any
script, image or text, that has those figures at hand.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from importlib.resources import files
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers.trainer_utils import has_length

from .card_settings import applied_settings, reference_model_source
from .data.specs import KNOWN_DATASETS
from .engine.accounting import plain_run_summary
from .engine.budget import PHI_COST_MODEL, PHI_GIVEN, PHI_MEASURED, PHI_MEASURING, PHI_NOT_MEASURED
from .engine.distributed import sum_over_processes

TEMPLATE_PATH = Path(str(files(__package__).joinpath("templates", "selective_backprop.md")))
TASKS = {
    "image-classification": "Image Classification",
    "text-classification": "Text Classification",
    "text-generation": "Text Generation",
    "text2text-generation": "Text2Text Generation",
}
# Language models by the loss they train (`losses.model_task`): GPT-2's head is no "...ForCausalLM".
_TASK_OF_LOSS = {"causal-lm": "text-generation", "seq2seq-lm": "text2text-generation"}
# Model class name endings of transformers' task heads; anything else is taken for an image classifier.
_TASK_OF_HEAD = {
    "ForImageClassification": "image-classification",
    "ForSequenceClassification": "text-classification",
    "ForCausalLM": "text-generation",
}
# Short names of datasets a local copy may be named after, and their Hub ids.
HUB_DATASETS = {spec.name: spec.hub_id for spec in KNOWN_DATASETS.values() if spec.hub_id} | {
    "sst2": "stanfordnlp/sst2",
}
STATS_KEYS = (
    "selection_forwards",
    "training_forwards",
    "backwards",
    "optimizer_steps",
    "kept_fraction",
    "queued_at_end",
    "train_seconds",
    "examples_seen",
    "reference_forwards",
    "reference_seconds",
    "budget_spent",
)
MISSING = "n/a"
#: What the card says of a budget run's phi, by where it came from (`engine.budget.PHI_*`).
PHI_SOURCES = {
    PHI_GIVEN: "given",
    PHI_MEASURED: "measured on the run's first optimizer steps",
    PHI_MEASURING: "the cost model's, until it is measured",
    PHI_NOT_MEASURED: "the cost model's: the run ended before it was measured",
    PHI_COST_MODEL: "the cost model's",
}
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def render_model_card(
    output_dir: str | os.PathLike,
    args: object,
    *,
    architecture: str,
    stats: Mapping[str, float | None],
    task: str = "image-classification",
    tags: Iterable[str] = (),
    dataset: str | os.PathLike | None = None,
    accuracy: float | None = None,
    eval_split: str | None = None,
    eval_loss: float | None = None,
    token_accuracy: float | None = None,
    library_versions: Mapping[str, str] | None = None,
    num_train_examples: int | None = None,
    model_name: str | None = None,
    model_class: str | None = None,
    base_model: str | None = None,
    repo_id: str | None = None,
    hyperparameters: Mapping[str, object] | None = None,
    eval_lines: list[dict] | None = None,
    language: str | list[str] | None = None,
    license: str | None = None,
    template: str | os.PathLike | None = None,
    record: Mapping[str, object] | None = None,
    package_network: bool = False,
) -> Path:
    """Write the Selective-Backprop card as ``README.md`` into ``output_dir`` and return its path.

    ``args`` is the training-arguments object: the strategy and every ``sb_*`` setting given another value than its
    default are listed (`applied_settings`), a local path by its last component only.
    ``stats`` holds run totals (keys in `STATS_KEYS`, as in ``sb_stats.json``); missing ones read
    "n/a". ``task`` is the pipeline tag (one of `TASKS`). ``dataset`` may be a name, a Hub id or a
    local folder: only a Hub id reaches the card (see `hub_dataset_id`); so does ``base_model``
    only when it is a Hub id, not a local folder. ``hyperparameters`` and
    ``eval_lines`` are the Trainer's own sections (see `write_trainer_card`). The results headline is the
    run's own metric: ``accuracy``, else ``token_accuracy`` (SFT's mean token accuracy), else ``eval_loss``.
    ``library_versions`` adds to the versions listed (a trainer's own library, such as TRL). ``record`` describes
    the example record written beside the model (`record_summary`), if any.
    ``package_network``: ``architecture`` is one of this package's timm networks (`cifar_nets`), which load only
    once the package is imported: the card's snippet imports it.
    """
    if task not in TASKS:
        raise ValueError(f"task {task!r} has no card: choose from {', '.join(TASKS)}")
    template_path = Path(template) if template is not None else TEMPLATE_PATH
    if not template_path.is_file():
        raise FileNotFoundError(f"model card template not found at {template_path}")
    output_dir = Path(output_dir)
    model_name = model_name or output_dir.resolve().name
    dataset_id = hub_dataset_id(dataset)
    base_model = _hub_model_id(base_model)

    card_data = ModelCardData(
        language=language,
        license=license,
        library_name="transformers",
        pipeline_tag=task,
        tags=_unique(["selective-backprop", task, *tags]),
        base_model=base_model,
        datasets=[dataset_id] if dataset_id else None,
        metrics=["accuracy"] if accuracy is not None else None,
        model_name=model_name,
        eval_results=_eval_results(task, dataset_id, eval_split, accuracy),
    )
    full_pass, backwards, kept = stats.get("examples_seen"), stats.get("backwards"), stats.get("kept_fraction")
    card = ModelCard.from_template(
        card_data,
        template_path=str(template_path),
        model_name=model_name,
        architecture=architecture,
        model_class=model_class or architecture,
        task_name=TASKS[task],
        dataset=dataset_id,
        base_model=base_model,
        repo_id=repo_id or model_name,
        eval_split=eval_split or "evaluation set",
        headline=_headline(accuracy, token_accuracy, eval_loss),
        stats={key: _format(stats.get(key)) for key in STATS_KEYS} | {"kept_fraction": _percent(kept)},
        backward_fraction=_percent(backwards / full_pass if backwards is not None and full_pass else None),
        full_pass_backwards=_format(full_pass),
        num_train_examples=_format(num_train_examples),
        strategy=getattr(args, "sb_strategy", MISSING),
        reference_model=reference_model_source(args),
        budget=getattr(args, "sb_budget", None),
        cost_phi=_phi(stats),
        sb_settings={name: _cell(value) for name, value in applied_settings(args).items()},
        selection_forward=bool(stats.get("selection_forwards")),
        hyperparameters=dict(hyperparameters or {}),
        eval_table=_markdown_table(eval_lines),
        versions={**_versions(), **(library_versions or {})},
        record=record,
        package_network=package_network,
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "README.md"
    card.save(path)
    return path


def write_trainer_card(
    trainer,
    language: str | None = None,
    license: str | None = None,
    tags: str | list[str] | None = None,
    model_name: str | None = None,
    finetuned_from: str | None = None,
    tasks: str | list[str] | None = None,
    dataset_tags: str | list[str] | None = None,
    dataset: str | list[str] | None = None,
    *,
    eval_split: str | None = None,
) -> Path | None:
    """The card of ``trainer``'s run in its ``output_dir`` (the arguments of `Trainer.create_model_card`).

    Settings come from ``trainer.args``, savings from `training_costs`, accuracy from the last
    ``eval_accuracy`` in the log history, hyperparameters and the evaluation table as the Trainer
    writes them. The dataset is the first of ``dataset_tags``/``dataset`` with a Hub id, or when
    neither is given the one the training set was loaded from, if it is known. Returns None on
    processes other than the main one, which write nothing. During training (TRL's SFTTrainer writes the
    card at every checkpoint) every process must call it: the costs so far are summed over them.
    """
    from transformers.modelcard import extract_hyperparameters_from_trainer, parse_log_history

    costs = training_costs(trainer)  # before the main-process check: during training it is a collective
    if not trainer.is_world_process_zero():
        return None
    model = trainer.model
    config = getattr(model, "config", None)
    names = _listify(dataset_tags) + _listify(dataset)
    ids = [hub_dataset_id(name) for name in names] if names else [_dataset_of(trainer.train_dataset)]
    task = (_listify(tasks) or [_task_of(model)])[0]
    is_timm = hasattr(model, "timm_model")
    _, eval_lines, _ = parse_log_history(trainer.state.log_history)
    return render_model_card(
        trainer.args.output_dir,
        trainer.args,
        architecture=_architecture(model),
        model_class=type(model).__name__,
        stats=costs,
        task=task,
        # A trainer's own tags too: TRL's SFTTrainer tags its models "trl" and "sft".
        tags=[*(["timm"] if is_timm else []), *getattr(trainer, "_tag_names", []), *_listify(tags),
              "generated_from_trainer"],
        dataset=next((i for i in ids if i), None),
        accuracy=_last_logged(trainer, "eval_accuracy"),
        eval_split=eval_split,
        eval_loss=_last_logged(trainer, "eval_loss"),
        token_accuracy=_last_logged(trainer, "eval_mean_token_accuracy"),
        library_versions=_trainer_library_versions(trainer),
        num_train_examples=len(trainer.train_dataset) if has_length(trainer.train_dataset) else None,
        model_name=model_name,
        base_model=finetuned_from or getattr(config, "_name_or_path", None),
        repo_id=getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id,
        hyperparameters=extract_hyperparameters_from_trainer(trainer),
        eval_lines=eval_lines,
        language=language,
        license=license,
        record=record_summary(trainer.args.output_dir, trainer.args.sb_index_column),
        package_network=type(getattr(model, "timm_model", None)).__module__ == f"{__package__}.cifar_nets",
    )


def record_summary(output_dir: str | os.PathLike, id_column: str) -> dict | None:
    """What the card says of the example record in ``output_dir`` (None when the run wrote none)."""
    from .record.files import DATA_MAP_FILE, RECORD_FILE
    from .record.scores import AMBIGUOUS, EASY, HARD

    path = Path(output_dir) / RECORD_FILE
    if not path.is_file():
        return None
    import pyarrow.parquet

    table = pyarrow.parquet.read_table(path, columns=["region"])
    regions = table.column("region").to_pylist()
    counts = ", ".join(f"{regions.count(name):,} {name}" for name in (EASY, AMBIGUOUS, HARD))
    return {
        "file": RECORD_FILE,
        "examples": f"{table.num_rows:,}",
        "id_column": id_column,
        "regions": f"Data-map regions: {counts}.",
        "data_map": DATA_MAP_FILE if (Path(output_dir) / DATA_MAP_FILE).is_file() else None,
    }


def training_costs(trainer) -> dict:
    """What the run cost: the trainer's ``sb_stats`` (a run without selection has the full-pass counters). Empty
    before training.

    During a selective run the counters so far, summed over processes (a collective), with the kept rows still
    queued: the card of its last checkpoint, at the run's end, holds the run's costs."""
    if getattr(trainer, "sb_stats", None):
        return dict(trainer.sb_stats)
    if getattr(trainer, "selector", None) is not None and trainer.is_in_train:
        queued = sum_over_processes(trainer.accelerator, {"rows": len(trainer.engine.queue)})["rows"]
        return {**trainer.selection_summary(), "queued_at_end": int(queued)}
    state = trainer.state
    runtime = next((entry["train_runtime"] for entry in reversed(state.log_history) if "train_runtime" in entry), None)
    if trainer.args.sb_strategy != "none":
        return {}
    if runtime is None and not trainer.is_in_train:  # not trained yet (during training: its wall time is unknown)
        return {}
    return plain_run_summary(trainer, runtime)


def hub_dataset_id(source: str | os.PathLike | None) -> str | None:
    """The Hub id a card lists under ``datasets:`` for a dataset name, Hub id or local folder.

    Known names and local copies of known datasets map to their Hub id (``cifar10`` and a folder
    ``.../cifar10`` -> ``uoft-cs/cifar10``; see `HUB_DATASETS`); any other ``owner/name`` is taken as
    a Hub id. Anything else (an unknown folder, scikit-learn's digits) has none: a card never shows
    a local path.
    """
    if source is None:
        return None
    text = os.fspath(source)
    known = _known_hub_id(text)
    if known:
        return known
    path = Path(text).expanduser()
    if path.is_absolute() or text.startswith((".", "~")) or path.exists():
        return _known_hub_id(path.resolve().name)
    return text if _HUB_ID.fullmatch(text) else None


def _last_logged(trainer, key: str) -> float | None:
    return next((log[key] for log in reversed(trainer.state.log_history) if key in log), None)


def _known_hub_id(name: str) -> str | None:
    key = _key(name)
    for short, hub_id in HUB_DATASETS.items():
        if key in (_key(short), _key(hub_id), _key(hub_id.split("/")[-1])):
            return hub_id
    return None


def _key(name: str) -> str:
    # "CIFAR-10", "cifar_10" and "cifar10" name the same dataset.
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _dataset_of(train_dataset) -> str | None:
    # A `datasets.Dataset` remembers the name it was loaded under (a Hub repo's or a local folder's).
    info = getattr(train_dataset, "info", None)
    name = getattr(info, "dataset_name", None)
    return _known_hub_id(name) if name else None


def _hub_model_id(name: str | None) -> str | None:
    # config._name_or_path is a local folder when the model was loaded from one; only a Hub id is a base model.
    if not name or os.path.exists(name) or not _HUB_ID.fullmatch(name):
        return None
    return name


def _architecture(model) -> str:
    # A timm wrapper names its timm architecture (resnet18); other models their transformers model type.
    config = getattr(model, "config", None)
    return getattr(config, "architecture", None) or getattr(config, "model_type", None) or type(model).__name__


def _task_of(model) -> str:
    from .losses import model_task

    if model_task(model) in _TASK_OF_LOSS:
        return _TASK_OF_LOSS[model_task(model)]
    name = type(model).__name__
    return next((task for ending, task in _TASK_OF_HEAD.items() if name.endswith(ending)), "image-classification")


def _eval_results(task: str, dataset_id: str | None, split: str | None, accuracy: float | None):
    # The Hub's model-index needs a dataset for every result.
    if accuracy is None or dataset_id is None:
        return None
    return [
        EvalResult(
            task_type=task,
            task_name=TASKS[task],
            dataset_type=dataset_id,
            dataset_name=dataset_id,
            dataset_split=split,
            metric_type="accuracy",
            metric_name="Accuracy",
            metric_value=float(accuracy),
        )
    ]


def _markdown_table(lines: list[dict] | None) -> str:
    from transformers.modelcard import make_markdown_table

    return make_markdown_table(lines) if lines else ""


def _versions() -> dict[str, str]:
    import datasets
    import torch
    import transformers

    from . import __version__

    return {
        "hf-selective-backprop": __version__,
        "Transformers": transformers.__version__,
        "PyTorch": torch.__version__,
        "Datasets": datasets.__version__,
    }


def _headline(accuracy: float | None, token_accuracy: float | None, loss: float | None) -> tuple[str, str]:
    """(metric, value) of the card's results table: the run's own measure of quality."""
    if accuracy is None and token_accuracy is not None:
        return "mean token accuracy", _percent(token_accuracy)
    if accuracy is None and loss is not None:
        return "loss", f"{loss:.4f}"
    return "accuracy", _percent(accuracy)


def _trainer_library_versions(trainer) -> dict[str, str]:
    """The version of TRL when the trainer is one of its classes (SFTTrainer and the like)."""
    if any(cls.__module__.split(".")[0] == "trl" for cls in type(trainer).__mro__):
        import trl

        return {"TRL": trl.__version__}
    return {}


def _listify(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _format(value: float | None) -> str:
    if value is None:
        return MISSING
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}"


def _phi(stats: Mapping) -> str:
    phi = stats.get("cost_phi")
    if phi is None:
        return MISSING
    source = PHI_SOURCES.get(stats.get("cost_phi_source"))
    return f"{phi:.3f}" + (f" ({source})" if source else "")


def _percent(value: float | None) -> str:
    return MISSING if value is None else f"{100 * value:.2f} %"


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")  # a bare pipe would split the table cell
