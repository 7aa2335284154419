"""Train the offline WordPiece tokenizer of scripts/train_text.py once and save it, to reuse it.

    python scripts/train_tokenizer.py --dataset ../shared/data/sst2 --output_dir benchmarks/results/sst2/tokenizer

`tokenizers`' trainer can learn a different vocabulary from the same text in another process
(huggingface/tokenizers#1794), so runs that must be comparable or repeatable share a saved one:
pass the folder as --tokenizer_name to scripts/train_text.py or benchmarks/benchmark_text.py.
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from hf_selective_backprop.data.text import TextDataArguments, load_text_data, texts_of, train_wordpiece_tokenizer
from hf_selective_backprop.text_models import TextModelArguments


@dataclass
class TokenizerOutput:
    output_dir: str = field(metadata={"help": "Folder for the tokenizer files (save_pretrained)."})


def main() -> None:
    parser = HfArgumentParser((TokenizerOutput, TextDataArguments, TextModelArguments))
    out, data_args, model_args = parser.parse_args_into_dataclasses()
    data = load_text_data(data_args)
    texts = texts_of(data.train, data.text_column, data_args.text_pair_column, max_length=data_args.max_length)
    tokenizer = train_wordpiece_tokenizer(
        texts, model_args.vocab_size, data_args.max_length, token_type_ids=data_args.task == "text-classification"
    )
    tokenizer.save_pretrained(out.output_dir)
    print(f"{len(tokenizer)} tokens -> {out.output_dir}")


if __name__ == "__main__":
    main()
