"""Model cards for checkpoints: what was trained, how, and what selection saved."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from string import Template

from huggingface_hub import EvalResult, ModelCardData

# The template lives at the repository root (model_cards/), next to this package.
TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "model_cards" / "selective_backprop.md"
TAGS = ["image-classification", "timm", "selective-backprop"]
STATS_KEYS = (
    "selection_forwards",
    "training_forwards",
    "backwards",
    "optimizer_steps",
    "kept_fraction",
    "train_seconds",
    "examples_seen",
)
MISSING = "n/a"


def render_model_card(
    output_dir: str | Path,
    args: object,
    *,
    architecture: str,
    dataset: str,
    stats: Mapping[str, float],
    accuracy: float | None = None,
    eval_split: str = "test",
    num_train_examples: int | None = None,
    epochs: float | None = None,
    model_name: str | None = None,
    template: str | Path | None = None,
    pipeline_tag: str = "image-classification",
) -> Path:
    """Write ``README.md`` into ``output_dir`` and return its path.

    ``args`` is the training-arguments object: every non-callable attribute whose name
    starts with ``sb_`` is listed. ``stats`` holds run totals (keys in `STATS_KEYS`); missing
    ones read "n/a". The full-pass backward count is ``stats["examples_seen"]`` when known
    (epochs x N for whole epochs), else ``epochs`` (default ``args.num_train_epochs``) x
    ``num_train_examples``. ``pipeline_tag`` is the Hub task (e.g. ``text-classification``, with a
    template of its own).
    """
    output_dir = Path(output_dir)
    template_path = Path(template) if template is not None else TEMPLATE_PATH
    if not template_path.is_file():
        raise FileNotFoundError(f"model card template not found at {template_path}")
    model_name = model_name or output_dir.resolve().name

    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=TAGS if pipeline_tag == TAGS[0] else [pipeline_tag, "selective-backprop"],
        datasets=[dataset],
        metrics=["accuracy"],
        model_name=model_name if accuracy is not None else None,
        eval_results=None
        if accuracy is None
        else [
            EvalResult(
                task_type=pipeline_tag,
                task_name=pipeline_tag.replace("-", " ").title(),
                dataset_type=dataset,
                dataset_name=dataset,
                dataset_split=eval_split,
                metric_type="accuracy",
                metric_name="Accuracy",
                metric_value=float(accuracy),
            )
        ],
    )

    if epochs is None:
        epochs = getattr(args, "num_train_epochs", None)
    full_pass = stats.get("examples_seen")
    if full_pass is None and epochs is not None and num_train_examples is not None:
        full_pass = epochs * num_train_examples
    backwards = stats.get("backwards")
    fraction = backwards / full_pass if backwards is not None and full_pass else None

    values = {key: _format(stats.get(key)) for key in STATS_KEYS}
    values["kept_fraction"] = _percent(stats.get("kept_fraction"))
    values.update(
        card_data=card_data.to_yaml(),
        model_name=model_name,
        architecture=architecture,
        dataset=dataset,
        eval_split=eval_split,
        accuracy=_percent(accuracy),
        backward_fraction=_percent(fraction),
        full_pass_backwards=_format(full_pass),
        num_train_examples=_format(num_train_examples),
        strategy=getattr(args, "sb_strategy", MISSING),
        sb_settings="\n".join(f"| `{name}` | `{_cell(value)}` |" for name, value in sb_settings(args).items()),
    )
    text = Template(template_path.read_text(encoding="utf-8")).substitute(values)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "README.md"
    path.write_text(text, encoding="utf-8")
    return path


def sb_settings(args: object) -> dict[str, object]:
    """Every ``sb_*`` setting of ``args``, by name: new options appear without code changes."""
    names = sorted(name for name in dir(args) if name.startswith("sb_"))
    settings = {name: getattr(args, name) for name in names}
    return {name: value for name, value in settings.items() if not callable(value)}


def _format(value: float | None) -> str:
    if value is None:
        return MISSING
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}"


def _percent(value: float | None) -> str:
    return MISSING if value is None else f"{100 * value:.2f} %"


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")  # a bare pipe would split the table cell
