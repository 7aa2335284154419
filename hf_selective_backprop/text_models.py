"""Text models: a small BERT classifier or GPT-2 language model built from a config, or any Hub model."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedModel,
)

from .engine.checkpoints import require_readable_model
from .weights import as_float_model, resolve

logger = logging.getLogger(__name__)

#: The Hub pipeline tag (the model card's task) of each task.
PIPELINE_TAGS = {"text-classification": "text-classification", "causal-lm": "text-generation"}
#: What each task needs of a --model_name_or_path, in a message.
TASK_NEEDS = {
    "text-classification": "a text model that AutoModelForSequenceClassification can put a classifier on (BERT, "
    "GPT-2, ...)",
    "causal-lm": "a causal language model, one AutoModelForCausalLM loads as it was saved (GPT-2, Llama, ...)",
}
#: What a saved model is, by the `transformers` auto-mapping its class is in (the first that holds it).
MODEL_KINDS = {
    "IMAGE_CLASSIFICATION": "an image classifier", "SEQUENCE_CLASSIFICATION": "a text classifier",
    "TOKEN_CLASSIFICATION": "a token classifier", "MASKED_LM": "a masked language model",
    "CAUSAL_LM": "a causal language model", "SEQ_TO_SEQ_CAUSAL_LM": "a sequence-to-sequence model",
}


@dataclass
class TextModelArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Hub id or folder of a pretrained model (and its tokenizer). A Hub id whose weights the "
                  "`pretrained` extra installed (sentence-transformers/all-MiniLM-L6-v2, "
                  "HuggingFaceTB/SmolLM2-135M-Instruct) loads the installed copy, its sha256 checked. Default: a "
                  "small model built from the size flags below, with a WordPiece tokenizer trained on the training "
                  "split."},
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Hub id or folder of a tokenizer (default: the model's, or a trained one)."}
    )
    vocab_size: int = field(default=8000, metadata={"help": "Vocabulary of the trained WordPiece tokenizer."})
    num_layers: int = field(default=2, metadata={"help": "Transformer layers of a model built from scratch."})
    hidden_size: int = field(default=128, metadata={"help": "Hidden size of a model built from scratch."})
    num_heads: int = field(default=2, metadata={"help": "Attention heads (must divide --hidden_size)."})
    intermediate_size: int = field(default=512, metadata={"help": "Feed-forward size of a model built from scratch."})
    dropout: float = field(default=0.1, metadata={"help": "Dropout of a model built from scratch."})

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "hidden_size", "num_heads", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"--num_heads {self.num_heads} must divide --hidden_size {self.hidden_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout}")
        # Here, before any data is read.
        require_readable_model(self.model_name_or_path, "--model_name_or_path")
        require_readable_model(self.tokenizer_name, "--tokenizer_name")


def model_flags(args: TextModelArguments, max_length: int | None = None) -> dict:
    """The flags that decide the model's shapes (those that apply): recorded with each checkpoint and compared
    when a run resumes (engine/run_signature.py). ``max_length`` is the script's --max_length, the positions of a
    model built from scratch."""
    flags = {"--model_name_or_path": args.model_name_or_path, "--tokenizer_name": args.tokenizer_name}
    if args.model_name_or_path is None:
        flags.update({"--num_layers": args.num_layers, "--hidden_size": args.hidden_size,
                      "--num_heads": args.num_heads, "--intermediate_size": args.intermediate_size})
        if max_length is not None:
            flags["--max_length"] = max_length
    if args.model_name_or_path is None and args.tokenizer_name is None:
        flags["--vocab_size"] = args.vocab_size  # a tokenizer learnt from the training split
    return flags


def require_model_for(args: TextModelArguments, task: str, script: str) -> None:
    """Refuse a --model_name_or_path of the wrong kind for ``task`` before anything is read or trained, naming the
    flag, what the model is and what ``script`` (the command, in words) needs (an image classifier failed in its
    tokenizer, and a text
    classifier given to SFT was loaded as a causal LM and failed mid-training). A model whose config cannot be read
    here (a Hub id offline) is left to the loaders."""
    if args.model_name_or_path is None:
        return
    from transformers.models.auto import modeling_auto

    path, kwargs = resolve(args.model_name_or_path)
    try:
        config = AutoConfig.from_pretrained(path, **kwargs)
    except (OSError, ValueError):
        return
    saved = (getattr(config, "architectures", None) or [None])[0]
    if task == "causal-lm":
        causal = _class_names(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
        fits = saved in causal if saved else config.model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    else:  # a classifier head on any backbone of a type that has one
        fits = config.model_type in modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
    if fits:
        return
    kind = next((kind for mapping, kind in MODEL_KINDS.items()
                 if saved in _class_names(getattr(modeling_auto, f"MODEL_FOR_{mapping}_MAPPING_NAMES"))),
                f"a {config.model_type} model")
    raise ValueError(
        f"--model_name_or_path {args.model_name_or_path!r} is {kind} ({saved or config.model_type}): {script} "
        f"needs {TASK_NEEDS[task]}"
    )


def _class_names(mapping) -> set[str]:
    names = set()
    for value in mapping.values():
        names.update(value if isinstance(value, (list, tuple)) else [value])
    return names


def load_tokenizer(args: TextModelArguments):
    """The named tokenizer (or the model's), or None when one must be trained."""
    name = args.tokenizer_name or args.model_name_or_path
    if name is None:
        return None
    path, kwargs = resolve(name)
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    if tokenizer.pad_token is None:
        # GPT-2 style tokenizers have no pad token; padded positions are masked out anyway.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def model_positions(args: TextModelArguments) -> int | None:
    """The positions a pretrained model (--model_name_or_path) has: its config's ``max_position_embeddings``
    (``n_positions`` in GPT-2 style configs); None for a model built from scratch, which --max_length sizes."""
    if args.model_name_or_path is None:
        return None
    path, kwargs = resolve(args.model_name_or_path)
    config = AutoConfig.from_pretrained(path, **kwargs)
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def fitted_max_length(max_length: int, tokenizer, positions: int | None = None) -> int:
    """--max_length, or the model's own limit where that is shorter: its tokenizer's ``model_max_length`` (as the
    Hugging Face example scripts take it), or the model's ``positions`` (`model_positions`), which a tokenizer saved
    without a limit does not know: a longer row would index past the model's position embeddings."""
    limits = [("its tokenizer's model_max_length", getattr(tokenizer, "model_max_length", None)),
              ("its config's max_position_embeddings", positions)]
    known = [(limit, i, name) for i, (name, limit) in enumerate(limits) if limit is not None and limit < max_length]
    if not known:
        return max_length
    limit, _, name = min(known)
    logger.warning(
        "--max_length %d is longer than the model takes (%s, %d): texts are truncated to %d tokens",
        max_length, name, limit, limit,
    )
    return limit


def build_text_model(args: TextModelArguments, tokenizer, task: str, max_length: int,
                     label_names: Sequence[str] | None = None) -> PreTrainedModel:
    """A text-classification (BERT) or causal-LM (GPT-2) model for ``tokenizer``'s vocabulary."""
    labels = {}
    if task == "text-classification":
        names = list(label_names or [])
        labels = {"num_labels": len(names), "id2label": dict(enumerate(names)),
                  "label2id": {name: i for i, name in enumerate(names)}}
    if args.model_name_or_path is not None:
        path, kwargs = resolve(args.model_name_or_path)
        if task == "causal-lm":
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        else:
            model = AutoModelForSequenceClassification.from_pretrained(
                path, ignore_mismatched_sizes=True, **labels, **kwargs
            )
        if "gguf_file" in kwargs:
            model = as_float_model(model)
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        return model
    sizes = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                 bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    if task == "causal-lm":
        config = GPT2Config(n_positions=max_length, n_embd=args.hidden_size, n_layer=args.num_layers,
                            n_head=args.num_heads, n_inner=args.intermediate_size, resid_pdrop=args.dropout,
                            embd_pdrop=args.dropout, attn_pdrop=args.dropout, **sizes)
        return GPT2LMHeadModel(config)
    config = BertConfig(hidden_size=args.hidden_size, num_hidden_layers=args.num_layers,
                        num_attention_heads=args.num_heads, intermediate_size=args.intermediate_size,
                        max_position_embeddings=max_length, hidden_dropout_prob=args.dropout,
                        attention_probs_dropout_prob=args.dropout, **sizes, **labels)
    return BertForSequenceClassification(config)

