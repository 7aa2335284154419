"""Any timm architecture as a transformers model, through `TimmWrapperForImageClassification`."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field

from ._optional import require

timm = require("timm", "hf_selective_backprop.models (timm image models)")

from transformers import TimmWrapperConfig, TimmWrapperForImageClassification  # noqa: E402

# Registers the 32x32-native networks (cifar_resnet20, cifar_convnet_half, ...) as timm architectures.
from . import cifar_nets  # noqa: E402,F401

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
        metadata={"help": "Start from timm's pretrained weights (downloaded from the Hub)."},
    )
    drop_rate: float | None = field(
        default=None, metadata={"help": "Dropout before the classifier (default: the architecture's)."}
    )

    def __post_init__(self):
        if self.drop_rate is not None and not 0.0 <= self.drop_rate < 1.0:
            raise ValueError(f"--drop_rate must be in [0, 1), got {self.drop_rate!r}")


def model_flags(args: ModelArguments) -> dict:
    """The flags that decide the model's shapes: recorded with each checkpoint and compared when a run resumes
    (engine/run_record.py)."""
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

    ``pretrained_cfg`` records the input size and normalization, so `save_pretrained`
    followed by `AutoImageProcessor.from_pretrained` / `AutoModelForImageClassification
    .from_pretrained` on the folder rebuilds both without the network.
    """
    architecture = model_args.model
    if not timm.is_model(architecture):
        close = difflib.get_close_matches(architecture, timm.list_models(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"--model {architecture!r} is not a timm architecture.{hint} List them with timm.list_models('*pattern*')."
        )
    height, width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(mean) != in_chans or len(std) != in_chans:
        raise ValueError(f"mean/std need {in_chans} values (in_chans), got {len(mean)} and {len(std)}")
    names = list(label_names) if label_names is not None else [str(i) for i in range(num_labels)]
    if len(names) != num_labels:
        raise ValueError(f"{len(names)} label names for {num_labels} labels")

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
    if model_args.pretrained:
        # TimmWrapper always builds from scratch; timm fetches the weights and adapts the
        # stem to in_chans and the head to num_labels.
        weights = timm.create_model(architecture, pretrained=True, num_classes=num_labels, **model_kwargs)
        model.timm_model.load_state_dict(weights.state_dict())
    return model
