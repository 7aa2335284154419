"""Pretrain a small BERT (masked language modelling) or GPT-2 (causal language modelling) on the text of a dataset's
splits, its labels unused: task-adaptive pretraining (Gururangan et al., ACL 2020, "Don't Stop Pretraining"), the
stand-in for a downloaded checkpoint that benchmarks/run_finetune.sh fine-tunes where the Hub cannot be reached.

    python scripts/pretrain_lm.py --dataset path/to/sst2 --objective mlm --output_dir outputs/bert-sst2
    python scripts/train_text.py --dataset path/to/sst2 --model_name_or_path outputs/bert-sst2 ...

A WordPiece tokenizer is learnt from the same text and saved with the model (save_pretrained), with
train_results.json and all_results.json (the pretraining's time; no split is held out, so no eval_results.json)
and trainer_state.json. After an interruption the same command plus
`--resume_from_checkpoint True` continues from the last checkpoint, with the tokenizer saved in it.
An --output_dir that already holds files is refused unless resuming or given --overwrite_output_dir, as the
other scripts refuse it. Every flag: --help.
"""

import os
from dataclasses import dataclass, field

import datasets
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

from hf_selective_backprop.cli import group_flags
from hf_selective_backprop.data.sources import load_splits
from hf_selective_backprop.data.text import check_text_column, texts_of, train_wordpiece_tokenizer
from hf_selective_backprop.engine import run_signature
from hf_selective_backprop.output_lock import claimed
from hf_selective_backprop.text_models import TextModelArguments, build_text_model, model_flags
from hf_selective_backprop.workflow import (
    OutputArguments,
    check_output_dir,
    check_output_dir_is_free,
    resume_checkpoint,
    save_results,
)

OBJECTIVES = ("mlm", "causal")

DEFAULTS = dict(
    num_train_epochs=3,
    per_device_train_batch_size=64,
    learning_rate=1e-3,
    weight_decay=0.01,
    warmup_steps=0.06,
    save_strategy="epoch",
    save_total_limit=1,
    logging_steps=100,
    report_to="none",
)


@dataclass
class PretrainArguments:
    dataset: str = field(metadata={"help": "Hub id or local folder (Hub layout) whose text is pretrained on."})
    text_column: str = field(default="sentence", metadata={"help": "Column holding the text."})
    splits: str = field(
        default="train,validation,test",
        metadata={"help": "Comma-separated splits whose text is read (labels are never read)."},
    )
    objective: str = field(
        default="mlm",
        metadata={"help": "mlm: a BERT with masked language modelling (fine-tuned by train_text.py for "
                  "classification); causal: a GPT-2 language model (fine-tuned by train_sft.py).",
                  "choices": list(OBJECTIVES)},
    )
    max_length: int = field(default=64, metadata={"help": "Tokens per text (longer ones are truncated)."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens masked (mlm)."})

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"--mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if not self.split_names():
            raise ValueError(f"--splits names no split (got {self.splits!r}): pass comma-separated split names, "
                             "e.g. train,validation")
        if self.max_length < 1:
            raise ValueError(f"--max_length must be >= 1, got {self.max_length}")

    def split_names(self) -> list[str]:
        return [name.strip() for name in self.splits.split(",") if name.strip()]


def read_text(args: PretrainArguments) -> datasets.Dataset:
    loaded = load_splits(args.dataset, None, None)
    names = args.split_names()
    missing = [name for name in names if name not in loaded]
    if missing:
        raise ValueError(f"--splits names {missing}, which {args.dataset!r} lacks; it has {list(loaded)}")
    for name in names:
        if args.text_column not in loaded[name].column_names:
            raise ValueError(
                f"--text_column {args.text_column!r} is not a column of split {name!r}: {loaded[name].column_names}"
            )
        check_text_column(loaded[name], args.text_column, f" of split {name!r}")
    return datasets.concatenate_datasets([loaded[name].select_columns([args.text_column]) for name in names])


def main() -> None:
    # --help: the script's own flags first, then the Trainer's under a title of their own.
    parser = group_flags(HfArgumentParser((PretrainArguments, TextModelArguments, OutputArguments, TrainingArguments)))
    parser.set_defaults(**DEFAULTS)
    args, model_args, output_args, training_args = parser.parse_args_into_dataclasses()
    # Cheap checks first: none of these mistakes should cost reading the dataset.
    check_output_dir(training_args.output_dir)
    checkpoint = resume_checkpoint(training_args)
    flags = {**model_flags(model_args, args.max_length), "--objective": args.objective}
    run_signature.check_model_flags(checkpoint, flags)
    check_output_dir_is_free(training_args.output_dir, checkpoint, output_args.overwrite_output_dir)
    with claimed(training_args.output_dir):
        pretrain(args, model_args, training_args, checkpoint, flags)


def pretrain(args: PretrainArguments, model_args: TextModelArguments, training_args: TrainingArguments,
             checkpoint: str | None, flags: dict) -> None:
    set_seed(training_args.seed)
    text = read_text(args)
    if checkpoint is not None:
        # The vocabulary the run started with, saved in each checkpoint: learning it again could give other ids.
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    else:
        tokenizer = train_wordpiece_tokenizer(
            texts_of(text, args.text_column, max_length=args.max_length), model_args.vocab_size, args.max_length,
            token_type_ids=args.objective == "mlm",
        )
        # Not saved here: each checkpoint and the finished run save it (processing_class), and a run stopped before
        # its first checkpoint must leave the folder empty, or the same command is refused on restart.
    tokenized = text.map(
        lambda batch: tokenizer(batch[args.text_column], truncation=True, max_length=args.max_length),
        batched=True, remove_columns=[args.text_column],
    )
    if args.objective == "causal":
        model = build_text_model(model_args, tokenizer, "causal-lm", args.max_length)
    else:
        model = BertForMaskedLM(BertConfig(
            vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, hidden_size=model_args.hidden_size,
            num_hidden_layers=model_args.num_layers, num_attention_heads=model_args.num_heads,
            intermediate_size=model_args.intermediate_size, max_position_embeddings=args.max_length,
            hidden_dropout_prob=model_args.dropout, attention_probs_dropout_prob=model_args.dropout,
        ))
    collator = DataCollatorForLanguageModeling(
        tokenizer, mlm=args.objective == "mlm", mlm_probability=args.mlm_probability
    )
    # The model's flags ride in each checkpoint (trainer_state.json): a resume with others is refused before data.
    trainer = Trainer(model=model, args=training_args, train_dataset=tokenized, data_collator=collator,
                      processing_class=tokenizer, callbacks=[run_signature.PlainRunSignature.of(training_args, flags)])
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()
    # train_results.json, all_results.json and trainer_state.json, as the Hugging Face examples end. No evaluation:
    # every split named by --splits is pretrained on, so none is held out to evaluate on.
    save_results(trainer, result.metrics, None)
    print(f"pretrained ({args.objective}) {len(tokenized)} texts in {result.metrics['train_runtime']:.0f} s "
          f"-> {os.path.abspath(training_args.output_dir)}")


if __name__ == "__main__":
    main()
