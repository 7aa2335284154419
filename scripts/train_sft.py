"""Supervised fine-tuning (TRL's SFTTrainer) of a small causal LM with Selective-Backprop.

    pip install ".[trl]"
    python scripts/train_sft.py --dataset path/to/sst2 --sb_strategy sb --output_dir outputs/sst2-sft-sb
    python scripts/train_sft.py --dataset path/to/sst2 --sb_strategy none --output_dir outputs/sst2-sft

Trains on the dataset's text column as language-modelling data. Without --model_name_or_path, a
WordPiece tokenizer is trained on the training split and a small GPT-2 is built from the size flags
(no download). Every SFTConfig flag works (packing / padding_free with selection: docs/text.md). --help lists them.
"""

import math
from dataclasses import dataclass, field

from accelerate import PartialState
from tokenizers import processors
from transformers import AutoTokenizer, HfArgumentParser, set_seed

from hf_selective_backprop import SelectiveBackpropSFTConfig, SelectiveBackpropSFTTrainer
from hf_selective_backprop.cards import hub_dataset_id, training_costs
from hf_selective_backprop.cli import group_flags
from hf_selective_backprop.data.text import (
    TextDataArguments,
    label_completions,
    load_text_data,
    texts_of,
    train_wordpiece_tokenizer,
)
from hf_selective_backprop.engine import run_signature
from hf_selective_backprop.output_lock import claimed
from hf_selective_backprop.text_models import (
    TextModelArguments,
    build_text_model,
    fitted_max_length,
    load_tokenizer,
    model_flags,
    model_positions,
    require_model_for,
)
from hf_selective_backprop.workflow import (
    OutputArguments,
    check_output_dir,
    check_output_dir_is_free,
    resume_checkpoint,
    save_results,
)

DEFAULTS = dict(
    num_train_epochs=1,
    per_device_train_batch_size=32,
    per_device_eval_batch_size=128,
    learning_rate=1e-3,
    warmup_steps=0.06,
    max_length=64,
    bf16=False,  # SFTConfig turns bf16 on by default; pass --bf16 on hardware that has it
    eval_strategy="epoch",
    save_strategy="epoch",
    save_total_limit=1,
    logging_steps=100,
    report_to="none",
)


@dataclass
class SFTDataArguments:
    dataset: str = field(
        default="stanfordnlp/sst2",
        metadata={"help": "Hub id or local folder (Hub layout, e.g. path/to/sst2) of a dataset with a "
                  "text column."},
    )
    text_column: str | None = field(
        default=None, metadata={"help": "Text column (default: 'sentence', 'text', ... or the only string column)."}
    )
    eval_split: str | None = field(
        default="validation", metadata={"help": "Split to evaluate on ('' or 'none': no evaluation)."}
    )
    completion_from_label: bool = field(
        default=False,
        metadata={"help": "Train prompt-completion pairs: the text (then ' sentiment :') as the prompt, the name of "
                  "its label (--label_column, e.g. SST-2's negative/positive) as the completion; the loss, selection's "
                  "included, is on the completion alone. Default: the text column as language-modelling data."},
    )
    label_column: str | None = field(
        default=None, metadata={"help": "With --completion_from_label: the label column (default: 'label', ...)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Train on the first N examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Evaluate on the first N examples."})


def sft_tokenizer(texts, model_args: TextModelArguments, max_length: int):
    """A WordPiece tokenizer learnt from ``texts`` that opens each text with [CLS] and leaves the end to
    SFTTrainer, which appends the end-of-text token ([SEP]) itself."""
    tokenizer = train_wordpiece_tokenizer(texts, model_args.vocab_size, max_length, token_type_ids=False)
    cls = tokenizer.convert_tokens_to_ids("[CLS]")
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", special_tokens=[("[CLS]", cls)]
    )
    return tokenizer


def main() -> None:
    # --help: the script's own flags first, then the sb_* flags, then the Trainer's under a title of their own.
    parser = group_flags(
        HfArgumentParser((TextModelArguments, SFTDataArguments, OutputArguments, SelectiveBackpropSFTConfig))
    )
    parser.set_defaults(**DEFAULTS)
    model_args, data_args, output_args, config = parser.parse_args_into_dataclasses()
    require_model_for(model_args, "causal-lm", "scripts/train_sft.py")
    check_output_dir(config.output_dir)
    checkpoint = resume_checkpoint(config)
    run_signature.check_model_flags(checkpoint, model_flags(model_args, config.max_length))
    check_output_dir_is_free(config.output_dir, checkpoint, output_args.overwrite_output_dir)
    with claimed(config.output_dir):
        run(config, data_args, model_args, checkpoint)


def training_data_size(dataset) -> dict:
    """Tokens and sequences of one epoch of the prepared (tokenized, maybe packed) training data: the same
    text read packed or padded, so throughput compares in tokens whatever the layout."""
    lengths = [len(ids) for ids in dataset["input_ids"]]
    packed = "seq_lengths" in dataset.column_names
    sequences = sum(len(row) for row in dataset["seq_lengths"]) if packed else len(lengths)
    return {"train_tokens_per_epoch": sum(lengths), "train_sequences_per_epoch": sequences}


def run(config, data_args: SFTDataArguments, model_args: TextModelArguments, checkpoint: str | None) -> None:
    set_seed(config.seed)

    data = load_text_data(TextDataArguments(
        dataset=data_args.dataset, task="text-classification" if data_args.completion_from_label else "causal-lm",
        text_column=data_args.text_column, label_column=data_args.label_column,
        eval_split=data_args.eval_split, max_train_samples=data_args.max_train_samples,
        max_eval_samples=data_args.max_eval_samples, max_length=config.max_length,
    ))
    config.dataset_text_field = data.text_column
    train, evaluation = data.train, data.eval
    if data_args.completion_from_label:
        train, evaluation = (
            None if split is None else label_completions(split, data.text_column, data.label_column, data.label_names)
            for split in (data.train, data.eval)
        )
    tokenizer = load_tokenizer(model_args)
    if tokenizer is None and checkpoint is not None:
        # The vocabulary the run learnt, saved in each checkpoint: learning it again can give other ids.
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    if tokenizer is None:
        # The main process learns the vocabulary and saves it with the model; the others load that copy.
        with config.main_process_first(local=False, desc="train the tokenizer"):
            if config.process_index == 0:
                texts = texts_of(data.train, data.text_column, max_length=config.max_length)
                tokenizer = sft_tokenizer(texts, model_args, config.max_length)
                tokenizer.save_pretrained(config.output_dir)
            else:
                tokenizer = AutoTokenizer.from_pretrained(config.output_dir)

    # SFTTrainer truncates to --max_length: rows longer than a pretrained model's positions would index past them.
    if config.max_length is not None:
        config.max_length = fitted_max_length(config.max_length, tokenizer, model_positions(model_args))
    model = build_text_model(model_args, tokenizer, "causal-lm", config.max_length)
    trainer = SelectiveBackpropSFTTrainer(
        model=model, args=config, train_dataset=train, eval_dataset=evaluation, processing_class=tokenizer
    )
    trainer.model_flags = model_flags(model_args, config.max_length)
    train_output = trainer.train(resume_from_checkpoint=checkpoint)
    stats = training_costs(trainer)

    metrics = trainer.evaluate() if evaluation is not None else None
    if metrics is not None and "eval_loss" in metrics:
        metrics["eval_perplexity"] = math.exp(min(metrics["eval_loss"], 700.0))
    trainer.save_model()
    data_read = {**training_data_size(trainer.train_dataset), "num_train_epochs": config.num_train_epochs}
    # train_results.json, eval_results.json, all_results.json and trainer_state.json, as the Hugging Face examples end
    save_results(trainer, {**train_output.metrics, **data_read}, metrics)
    card = {"dataset": data_args.dataset, "eval_split": data_args.eval_split, "tasks": "text-generation"}
    if config.should_save:
        trainer.create_model_card(**card)
    if config.push_to_hub:
        name = hub_dataset_id(data_args.dataset) or data.dataset_id
        trainer.push_to_hub(commit_message=f"SFT, {config.sb_strategy} on {name}", **card)

    if config.should_save:
        results = " ".join(f"{k.removeprefix('eval_')}={v:.4f}" for k, v in (metrics or {}).items()
                           if "loss" in k or "perplexity" in k or "accuracy" in k)
        print(f"strategy={config.sb_strategy} {results} backwards={stats['backwards']} "
              f"selection_forwards={stats['selection_forwards']} -> {config.output_dir}")


if __name__ == "__main__":
    main()
    # Trainer leaves the process group up under `accelerate launch`; a rank exiting with gloo's
    # threads alive can abort after its work is done.
    PartialState().destroy_process_group()
