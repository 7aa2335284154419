"""Train a text classifier (or a small language model) with Selective-Backprop (or any other strategy).

    python scripts/train_text.py --dataset path/to/sst2 --sb_strategy sb --output_dir outputs/sst2-sb
    python scripts/train_text.py --dataset path/to/sst2 --task causal-lm --output_dir outputs/sst2-lm

Without --model_name_or_path, a WordPiece tokenizer is trained on the training split and a small
model is built from the size flags (no download); a resumed run reuses the one in its checkpoint.
An --output_dir that already holds files is refused unless resuming or given --overwrite_output_dir.
Works the same under `accelerate launch`.
Every flag: --help.
"""

import math
import os

from accelerate import PartialState
from transformers import (
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    HfArgumentParser,
    set_seed,
)

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.cards import hub_dataset_id, training_costs
from hf_selective_backprop.cli import group_flags
from hf_selective_backprop.data.text import (
    TextDataArguments,
    load_text_data,
    texts_of,
    tokenize,
    train_wordpiece_tokenizer,
)
from hf_selective_backprop.engine import run_signature
from hf_selective_backprop.metrics import compute_metrics
from hf_selective_backprop.output_lock import claimed
from hf_selective_backprop.text_models import (
    PIPELINE_TAGS,
    TextModelArguments,
    build_text_model,
    fitted_max_length,
    load_tokenizer,
    model_flags,
    model_positions,
    require_model_for,
)
from hf_selective_backprop.workflow import (
    TEXT_TRAINING_DEFAULTS,
    OutputArguments,
    check_output_dir,
    check_output_dir_is_free,
    resume_checkpoint,
    save_results,
)


def main() -> None:
    # --help: the script's own flags first, then the sb_* flags, then the Trainer's under a title of their own.
    parser = group_flags(
        HfArgumentParser((TextModelArguments, TextDataArguments, OutputArguments, SelectiveBackpropConfig))
    )
    parser.set_defaults(**TEXT_TRAINING_DEFAULTS)
    model_args, data_args, output_args, config = parser.parse_args_into_dataclasses()
    train(config, data_args, model_args, output_args.overwrite_output_dir)


def train(config: SelectiveBackpropConfig, data_args: TextDataArguments, model_args: TextModelArguments,
          overwrite_output_dir: bool = False) -> None:
    """Check the flags and --output_dir before any data is read, then `run` in the claimed folder (scripts/compare.py
    trains each of its text runs so)."""
    require_model_for(model_args, data_args.task, f"scripts/train_text.py --task {data_args.task}")
    check_output_dir(config.output_dir)
    checkpoint = resume_checkpoint(config)
    run_signature.check_model_flags(checkpoint, model_flags(model_args, data_args.max_length))
    check_output_dir_is_free(config.output_dir, checkpoint, overwrite_output_dir)
    with claimed(config.output_dir):
        run(config, data_args, model_args, checkpoint)


def run(config: SelectiveBackpropConfig, data_args: TextDataArguments, model_args: TextModelArguments,
          checkpoint: str | None) -> None:
    set_seed(config.seed)
    classification = data_args.task == "text-classification"

    data = load_text_data(data_args)
    tokenizer = load_tokenizer(model_args)
    if tokenizer is None and checkpoint is not None:
        # The vocabulary the run learnt, saved in each checkpoint: learning it again can give other ids.
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    if tokenizer is None:
        # The main process learns the vocabulary and saves it with the model; the others load that copy.
        with config.main_process_first(local=False, desc="train the tokenizer"):
            if config.process_index == 0:
                texts = texts_of(data.train, data.text_column, data_args.text_pair_column,
                                 max_length=data_args.max_length)
                tokenizer = train_wordpiece_tokenizer(
                    texts, model_args.vocab_size, data_args.max_length, token_type_ids=classification
                )
                tokenizer.save_pretrained(config.output_dir)
            else:
                tokenizer = AutoTokenizer.from_pretrained(config.output_dir)

    max_length = fitted_max_length(data_args.max_length, tokenizer, model_positions(model_args))
    with config.main_process_first(desc="tokenize"):
        columns = dict(label_column=data.label_column, text_pair_column=data_args.text_pair_column)
        train = tokenize(data.train, tokenizer, data.text_column, max_length, **columns)
        evaluation = None
        if data.eval is not None:
            evaluation = tokenize(data.eval, tokenizer, data.text_column, max_length, **columns)

    model = build_text_model(model_args, tokenizer, data_args.task, max_length, data.label_names)
    if classification:
        collator = DataCollatorWithPadding(tokenizer)
    else:
        collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    trainer = SelectiveBackpropTrainer(
        model=model,
        args=config,
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=compute_metrics if classification else None,
    )

    trainer.model_flags = model_flags(model_args, data_args.max_length)
    train_output = trainer.train(resume_from_checkpoint=checkpoint)
    stats = training_costs(trainer)

    metrics = trainer.evaluate() if evaluation is not None else None
    if metrics is not None and "eval_loss" in metrics and not classification:
        metrics["eval_perplexity"] = math.exp(min(metrics["eval_loss"], 700.0))
    trainer.save_model()
    # train_results.json (benchmarks read a run's cost from it), eval_results.json, all_results.json, trainer_state.json
    save_results(trainer, train_output.metrics, metrics)
    card = {"dataset": data_args.dataset, "eval_split": data_args.eval_split, "tasks": PIPELINE_TAGS[data_args.task]}
    if config.should_save:
        trainer.create_model_card(**card)
        if len(data.noisy_positions):  # the row positions are the example ids the record keys
            data.noisy_positions.tofile(os.path.join(config.output_dir, "noisy_indices.int64"))
    if config.push_to_hub:
        name = hub_dataset_id(data_args.dataset) or data.dataset_id
        trainer.push_to_hub(commit_message=f"{config.sb_strategy} on {name}", **card)

    if config.should_save:
        results = " ".join(f"{k.removeprefix('eval_')}={v:.4f}" for k, v in (metrics or {}).items() if "loss" in k or
                           "accuracy" in k or "perplexity" in k)
        print(f"strategy={config.sb_strategy} {results} backwards={stats['backwards']} "
              f"selection_forwards={stats['selection_forwards']} train_seconds={stats['train_seconds']:.1f} "
              f"-> {config.output_dir}")


if __name__ == "__main__":
    main()
    # Trainer leaves the process group up under `accelerate launch`; a rank exiting with gloo's
    # threads alive can abort after its work is done.
    PartialState().destroy_process_group()
