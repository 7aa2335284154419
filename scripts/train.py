"""Train a timm image classifier with Selective-Backprop (or any other strategy).

    python scripts/train.py --dataset path/to/cifar10 --model resnet18 \
        --sb_strategy sb --sb_beta 2 --num_train_epochs 1 --output_dir outputs/cifar10-sb

A checkpoint is saved every epoch (--save_strategy); after an interruption the same command plus
`--resume_from_checkpoint True` (or `last`) continues from the last complete one in --output_dir.
An --output_dir that already holds files (a finished run, checkpoints) is refused unless resuming
or given --overwrite_output_dir; rotation (--save_total_limit) deletes only this run's checkpoints.
Works the same under `accelerate launch` (see configs/accelerate/). Every flag: --help.
"""

from accelerate import PartialState
from transformers import HfArgumentParser

from hf_selective_backprop import SelectiveBackpropConfig
from hf_selective_backprop.cli import group_flags
from hf_selective_backprop.data import DataArguments
from hf_selective_backprop.models import ModelArguments
from hf_selective_backprop.workflow import IMAGE_TRAINING_DEFAULTS, OutputArguments, train_image_classifier


def main() -> None:
    # --help: the script's own flags first, then the sb_* flags, then the Trainer's under a title of their own.
    parser = group_flags(HfArgumentParser((ModelArguments, DataArguments, OutputArguments, SelectiveBackpropConfig)))
    parser.set_defaults(**IMAGE_TRAINING_DEFAULTS)
    model_args, data_args, output_args, config = parser.parse_args_into_dataclasses()
    result = train_image_classifier(config, data_args, model_args, output_args.overwrite_output_dir)
    if config.should_save:
        accuracy = "n/a" if result.accuracy is None else f"{result.accuracy:.4f}"
        print(f"strategy={result.strategy} accuracy={accuracy} backwards={result.stats['backwards']} "
              f"selection_forwards={result.stats['selection_forwards']} "
              f"train_seconds={result.stats['train_seconds']:.1f} -> {result.output_dir}")


if __name__ == "__main__":
    main()
    # Trainer leaves the process group up under `accelerate launch`; a rank exiting with gloo's
    # threads alive can abort after its work is done.
    PartialState().destroy_process_group()
