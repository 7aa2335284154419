"""Train the offline WordPiece tokenizer of scripts/train_text.py once and save it, to reuse it.

    python scripts/train_tokenizer.py --dataset ../shared/data/sst2 --output_dir benchmarks/results/sst2/tokenizer

`tokenizers`' trainer can learn a different vocabulary from the same text in another process
(huggingface/tokenizers#1794), so runs that must be comparable or repeatable share a saved one:
pass the folder as --tokenizer_name to scripts/train_text.py or benchmarks/benchmark_text.py.
An --output_dir that already holds files (a finished run, another tokenizer) is refused unless given
--overwrite_output_dir, and is claimed with a lock file while the tokenizer is trained, as the other scripts do.
"""

import os
import tempfile
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from hf_selective_backprop.data.text import TextDataArguments, load_text_data, texts_of, train_wordpiece_tokenizer
from hf_selective_backprop.output_lock import claimed
from hf_selective_backprop.text_models import TextModelArguments
from hf_selective_backprop.workflow import OutputArguments, check_output_dir, check_output_dir_is_free


@dataclass
class TokenizerOutput:
    output_dir: str = field(metadata={"help": "Folder for the tokenizer files (save_pretrained)."})


def save_in_place(tokenizer, folder: str) -> None:
    """``tokenizer.save_pretrained(folder)``, each file renamed into place: a symbolic link at one of the names
    is replaced, never followed to a file outside ``folder``."""
    with tempfile.TemporaryDirectory(dir=folder, prefix=".tokenizer-") as staging:
        tokenizer.save_pretrained(staging)
        for name in os.listdir(staging):
            os.replace(os.path.join(staging, name), os.path.join(folder, name))


def main() -> None:
    parser = HfArgumentParser((TokenizerOutput, TextDataArguments, TextModelArguments, OutputArguments))
    out, data_args, model_args, output_args = parser.parse_args_into_dataclasses()
    # Before the text is read: a tokenizer.json beside a finished model's weights must not be replaced unasked.
    check_output_dir(out.output_dir)
    check_output_dir_is_free(out.output_dir, overwrite=output_args.overwrite_output_dir, resumable=False)
    with claimed(out.output_dir):
        data = load_text_data(data_args)
        texts = texts_of(data.train, data.text_column, data_args.text_pair_column, max_length=data_args.max_length)
        tokenizer = train_wordpiece_tokenizer(
            texts, model_args.vocab_size, data_args.max_length, token_type_ids=data_args.task == "text-classification"
        )
        save_in_place(tokenizer, out.output_dir)
    print(f"{len(tokenizer)} tokens -> {out.output_dir}")


if __name__ == "__main__":
    main()
