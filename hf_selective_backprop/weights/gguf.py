"""Models read from a GGUF file (``from_pretrained(..., gguf_file=...)``), made ordinary float models to fine-tune."""

from __future__ import annotations


def as_float_model(model):
    """Transformers dequantizes a GGUF file's weights on load but keeps its GGUF "quantizer" on the model, and the
    Trainer refuses to fine-tune a model that has one ("purely quantized models"). The weights are float tensors,
    so the quantizer and its config entry go: the model trains, and `save_pretrained` writes an ordinary float
    checkpoint."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if getattr(model, "is_quantized", False):  # set beside the quantizer when the model is loaded
        model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model
