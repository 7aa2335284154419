"""How to pad queued text rows again: pad values and side from the tokenizer and data collator."""

from __future__ import annotations

IGNORE_INDEX = -100


def queue_padding(data_collator, processing_class, label_name: str = "labels", token_labels: bool = False,
                  encoder_decoder: bool = False) -> dict:
    """`BatchQueue` keyword arguments that re-pad rows as ``data_collator`` padded them.

    The tokenizer is the collator's (``DataCollatorWithPadding``, ``DataCollatorForTokenClassification``,
    ``DataCollatorForLanguageModeling``, ...) or ``processing_class`` (or its ``tokenizer``). Without a
    tokenizer that has a pad token, rows must have a fixed shape and ``{}`` is returned.
    ``token_labels``: the label column is one label per token (token classification, language
    modelling) and is padded with the collator's ``label_pad_token_id`` (default -100).
    ``encoder_decoder``: the labels and decoder inputs (``DataCollatorForSeq2Seq``) have a length of
    their own, apart from the source text's.
    """
    tokenizer = getattr(data_collator, "tokenizer", None) or processing_class
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a multimodal processor's text half
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None or getattr(tokenizer, "padding_side", None) is None:
        return {}
    pad_values = {
        "input_ids": pad_id,
        "attention_mask": 0,
        "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0),
        # The tokenizer marks padding as special.
        "special_tokens_mask": 1,
    }
    if token_labels:
        pad_values[label_name] = getattr(data_collator, "label_pad_token_id", IGNORE_INDEX)
    padding = {
        "pad_values": pad_values,
        "padding_side": tokenizer.padding_side,
        "pad_to_multiple_of": getattr(data_collator, "pad_to_multiple_of", None),
    }
    if encoder_decoder:
        # The collator shifts the labels right into the decoder inputs. Padding them with the pad token
        # changes nothing scored: past a row's last label, the causal decoder's inputs reach no scored position.
        pad_values |= {"decoder_input_ids": pad_id, "decoder_attention_mask": 0}
        padding["sequence_groups"] = dict.fromkeys((label_name, "decoder_input_ids", "decoder_attention_mask"),
                                                   "decoder")
        padding["derived_columns"] = ("decoder_input_ids",)
    return padding
