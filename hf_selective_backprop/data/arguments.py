"""Command-line options of the data pipeline, in `HfArgumentParser` style."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DataArguments:
    dataset: str = field(
        default="cifar10",
        metadata={
            "help": "cifar10, cifar100, svhn, mnist, digits (scikit-learn's, no download), a Hub id "
            "(e.g. uoft-cs/cifar10) or a local folder in the Hub layout (e.g. path/to/cifar10). A folder named "
            "after a known dataset, or whose dataset card (README.md) names one, gets that dataset's recipe "
            "(normalization, flips, cutout); any other gets the generic one (statistics measured, no flips, no "
            "cutout). The log says which recipe a run got; --data_dir chooses one for a folder."
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={"help": "Local folder (Hub layout) holding the dataset --dataset names (e.g. --dataset cifar10 "
                  "--data_dir path/to/my-copy): the folder trains with that dataset's recipe, whatever its name."},
    )
    dataset_config: str | None = field(
        default=None,
        metadata={"help": "Dataset config name (default: the known one, e.g. cropped_digits for svhn)."},
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Cache folder for `datasets`."})
    image_column: str | None = field(
        default=None, metadata={"help": "Image column (default: the dataset's, or its only image column)."}
    )
    label_column: str | None = field(
        default=None, metadata={"help": "Label column (default: the dataset's, or its class-label column)."}
    )
    num_labels: int | None = field(
        default=None,
        metadata={
            "help": "Number of classes. Default: the label column's ClassLabel names, else inferred from the "
            "integer labels of the train and eval splits (0..max), which must then use every id in between."
        },
    )
    classes: str | None = field(
        default=None,
        metadata={
            "help": "Comma-separated class ids to keep (e.g. 5,6,7,8,9), relabelled 0..K-1 in the order given, in the "
            "train and eval splits alike; a row's id stays its position in the split. For a transfer task: pretrain "
            "on some classes, fine-tune on the others. Default: every class."
        },
    )
    train_split: str = field(default="train", metadata={"help": "Split to train on."})
    eval_split: str | None = field(
        default="test", metadata={"help": "Split to evaluate on ('' or 'none': no evaluation)."}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Train on the first N examples of the train split (ids kept)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Evaluate on the first N examples of the eval split."}
    )
    label_noise: float = field(
        default=0.0,
        metadata={"help": "Fraction in [0, 1) of training labels flipped to a random other class."},
    )
    label_noise_seed: int = field(default=0, metadata={"help": "Seed choosing the flipped labels."})
    holdout_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Fraction in [0, 1) of the training rows (the first --max_train_samples, after label noise) set "
            "aside as a holdout, drawn with --holdout_seed. A run trains on the rest, or on the holdout alone with "
            "--train_on holdout (e.g. a RHO-LOSS reference model for --sb_reference_model): two runs with the same "
            "two flags never share a training row."
        },
    )
    holdout_seed: int = field(default=0, metadata={"help": "Seed choosing the holdout rows."})
    train_on: str = field(
        default="rest",
        metadata={
            "help": "With --holdout_fraction: 'rest' trains on the rows outside the holdout, 'holdout' on the holdout.",
            "choices": ["rest", "holdout"],
        },
    )
    image_size: int | None = field(
        default=None, metadata={"help": "Resize every image to this square size (default: native size)."}
    )
    num_channels: int = field(
        default=3, metadata={"help": "Channels images are converted to: 3 (RGB) or 1 (grayscale)."}
    )
    augment: bool = field(default=True, metadata={"help": "Random crop (4 px padding), flip where allowed, cutout."})
    cutout: int | None = field(
        default=None, metadata={"help": "Cutout square side in pixels, 0 for none (default: the dataset's)."}
    )
    hflip: bool | None = field(
        default=None, metadata={"help": "Random horizontal flips (default: the dataset's; off for digits)."}
    )

    def __post_init__(self):
        if not 0.0 <= self.label_noise < 1.0:
            raise ValueError(f"--label_noise must be in [0, 1), got {self.label_noise}")
        if self.num_channels not in (1, 3):
            raise ValueError(f"--num_channels must be 1 or 3, got {self.num_channels}")
        for name in ("max_train_samples", "max_eval_samples", "image_size", "num_labels"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name} must be >= 1, got {value}")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise ValueError(f"--holdout_fraction must be in [0, 1), got {self.holdout_fraction}")
        if self.train_on not in ("rest", "holdout"):
            raise ValueError(f"--train_on must be 'rest' or 'holdout', got {self.train_on!r}")
        if self.train_on == "holdout" and not self.holdout_fraction:
            raise ValueError("--train_on holdout needs a --holdout_fraction > 0 (the share of rows held out)")
        if self.cutout is not None and self.cutout < 0:
            raise ValueError(f"--cutout must be >= 0, got {self.cutout}")
        if self.classes is not None:
            self.class_ids()  # refused here, before anything is read
        if self.eval_split is not None and self.eval_split.lower() in ("", "none"):
            self.eval_split = None

    def class_ids(self) -> list[int] | None:
        """--classes as a list of ids (None: every class)."""
        if self.classes is None:
            return None
        parts = [part.strip() for part in str(self.classes).split(",") if part.strip()]
        # ASCII digits only: str.isdigit also takes superscripts ('²'), which int() refuses.
        if not parts or not all(part.isascii() and part.isdigit() for part in parts):
            raise ValueError(f"--classes must be comma-separated class ids >= 0 (e.g. 5,6,7,8,9), got {self.classes!r}")
        ids = [int(part) for part in parts]
        if len(set(ids)) != len(ids):
            raise ValueError(f"--classes names a class twice: {self.classes!r}")
        if len(ids) < 2:
            raise ValueError(f"--classes must keep at least 2 classes to classify, got {self.classes!r}")
        return ids
