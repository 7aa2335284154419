"""The selection forward: per-example losses of a batch, no gradients, model mode restored."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..losses import BadRowsError, PerExampleLoss, example_margins
from . import distributed

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: The ids an error names at most.
NAMED_IDS = 5


def naming_examples(error: ValueError, ids: torch.Tensor | None, index_column: str) -> ValueError:
    """``error`` naming the ids of the examples it is about (a `BadRowsError` of a batch whose ids are ``ids``): it
    may be raised on every rank, where a row's position in one rank's share of the batch means nothing."""
    if not isinstance(error, BadRowsError) or ids is None:
        return error
    shown = ids.reshape(-1)[error.rows[:NAMED_IDS]].tolist()
    listed = ", ".join(str(value) for value in shown) + (" ..." if len(error.rows) > NAMED_IDS else "")
    named = ValueError(f"{error} (the example{'s' if len(error.rows) > 1 else ''} whose {index_column!r} is {listed})")
    named.__cause__ = error
    return named


class SelectionScorer:
    """Runs the cheap forward that scores a selection batch.

    Options trade fidelity for cost (phi in the cost model): inference_mode, autocast
    precision, a lower input resolution and channels_last inputs.
    """

    def __init__(
        self,
        loss_fn: PerExampleLoss,
        label_name: str = "labels",
        mode: str = "eval",
        precision: str = "auto",
        scale: float = 1.0,
        channels_last: bool = False,
        inference_mode: bool = False,
        prepare_inputs: Callable[[dict], dict] | None = None,
    ):
        self.loss_fn = loss_fn
        self.label_name = label_name
        self.mode = mode
        self.precision = precision
        self.scale = scale
        self.channels_last = channels_last
        self.inference_mode = inference_mode
        self.prepare_inputs = prepare_inputs

    @classmethod
    def from_args(
        cls, loss_fn: PerExampleLoss, label_name: str, args, prepare_inputs: Callable[[dict], dict] | None = None
    ) -> SelectionScorer:
        """The scorer that a `SelectiveBackpropConfig`'s ``sb_selection_*`` flags describe; ``prepare_inputs``
        is the Trainer's input preparation (`hf_selective_backprop._compat.input_preparation`), applied to the model's
        inputs."""
        return cls(
            loss_fn,
            label_name=label_name,
            mode=args.sb_selection_mode,
            precision=args.sb_selection_precision,
            scale=args.sb_selection_scale,
            channels_last=args.sb_selection_channels_last,
            inference_mode=args.sb_selection_inference_mode,
            prepare_inputs=prepare_inputs,
        )

    def _grad_context(self):
        return torch.inference_mode() if self.inference_mode else torch.no_grad()

    @contextlib.contextmanager
    def _precision_context(self, model: torch.nn.Module, device: torch.device):
        # "auto" leaves precision to Accelerate, which patches autocast into model.forward.
        if self.precision == "auto":
            yield
            return
        if self.precision in _AUTOCAST_DTYPES:
            autocast = torch.autocast(device_type=device.type, dtype=_AUTOCAST_DTYPES[self.precision])
        else:
            autocast = torch.autocast(device_type=device.type, enabled=False)
        with _without_training_autocast(model), autocast:
            yield

    def _prepared(self, inputs: dict) -> dict:
        inputs = self._rescale(inputs)
        # Last, as training inputs are prepared: DeepSpeed casts floating inputs to the model's dtype here.
        return self.prepare_inputs(inputs) if self.prepare_inputs is not None else inputs

    def _rescale(self, inputs: dict) -> dict:
        if self.scale == 1.0 and not self.channels_last:
            return inputs
        if "pixel_values" not in inputs or inputs["pixel_values"].dim() != 4:
            raise ValueError(
                "--sb_selection_scale and --sb_selection_channels_last need 4-D 'pixel_values' inputs; "
                f"this model's batch has {sorted(inputs)}"
            )
        pixels = inputs["pixel_values"]
        if self.scale != 1.0:
            pixels = F.interpolate(pixels, scale_factor=self.scale, mode="bilinear", antialias=True)
        if self.channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        return {**inputs, "pixel_values": pixels}

    def __call__(self, model: torch.nn.Module, inputs: dict, with_margins: bool = False):
        """Per-example losses (float32, on the inputs' device) for a batch of model inputs; with ``with_margins``,
        the pair (losses, margins), margins by the loss's ``margins`` (`ExampleLoss.margins`; None where the loss
        has none or the task defines none)."""
        inputs = dict(inputs)
        if self.label_name not in inputs:
            raise ValueError(f"selection needs a '{self.label_name}' column; the batch has {sorted(inputs)}")
        labels = inputs.pop(self.label_name)
        inputs = self._prepared(inputs)
        was_training = model.training
        model.train(self.mode == "train")
        try:
            with self._grad_context(), self._precision_context(model, labels.device):
                # A loss may ask the forward for more, e.g. TRL's fused LM head: log-probabilities, not logits.
                extra = getattr(self.loss_fn, "forward_kwargs", None)
                outputs = self._forward(model, {**inputs, **extra(labels)} if extra is not None else inputs)
                losses = self.loss_fn(outputs, labels).float()
                margins = example_margins(self.loss_fn, outputs, labels) if with_margins else None
        finally:
            model.train(was_training)
        if self.inference_mode:
            losses = losses.clone()
            margins = margins.clone() if margins is not None else None
        return (losses, margins) if with_margins else losses

    def _forward(self, model: torch.nn.Module, inputs: dict):
        try:
            return model(**inputs)
        except (RuntimeError, AssertionError) as error:
            # Shape errors: a mismatched matmul (RuntimeError) or a fixed-size check such as
            # timm's ViT patch embedding (AssertionError).
            if self.scale != 1.0:
                raise ValueError(
                    f"the model cannot take inputs rescaled by --sb_selection_scale {self.scale} "
                    f"({type(error).__name__}: {error}); use --sb_selection_scale 1 for this model"
                ) from error
            raise

    def check_inputs(self, model: torch.nn.Module, inputs: dict) -> None:
        """Raise the selection forward's input errors now, on a few rows (e.g. one example).

        Only the input options (scale, channels_last) can make a forward fail that training's
        forward passes, so only they are checked: one eval-mode forward without gradients, on
        the inputs as the selection pass prepares them. Mode and BatchNorm statistics are
        left as they were. A no-op without those options.
        """
        if self.scale == 1.0 and not self.channels_last:
            return
        inputs = self._prepared({k: v for k, v in inputs.items() if k != self.label_name})
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), self._precision_context(model, next(iter(inputs.values())).device):
                self._forward(model, inputs)
        finally:
            model.train(was_training)


@contextlib.contextmanager
def _without_training_autocast(model: torch.nn.Module):
    """``model``'s own forward for the duration: with --bf16/--fp16 Accelerate replaces ``model.forward`` by one
    that enters autocast in the training precision (keeping the original as ``_original_forward``), and an
    autocast entered inside it would override any precision chosen outside."""
    original = model.__dict__.get("_original_forward")
    patched = model.__dict__.get("forward")
    if original is None or patched is None:
        yield
        return
    model.forward = original
    try:
        yield
    finally:
        model.forward = patched


def selection_model(wrapped: torch.nn.Module, accelerator, precision: str) -> torch.nn.Module:
    """The model the selection forward runs: the training model without its DDP wrapper.

    Under DDP a forward of the wrapper syncs buffers, a collective that ranks scoring different numbers of
    rows would not match; the inner module (which keeps Accelerate's autocast patch) needs no collective.
    With torch_compile the DDP wrapper sits inside the compiled one, so both are unwrapped
    (keep_torch_compile=False: keeping it would re-point the compiled module at the inner one and take DDP
    out of training too). A compiled model without a wrapper inside stays compiled, unless
    --sb_selection_precision needs the eager module (SelectionScorer swaps its forward).
    """
    if distributed.fsdp_version(accelerator) is not None:
        return wrapped  # FSDP2 shards the module in place: its forward gathers the weights, as training's does
    inner = accelerator.unwrap_model(wrapped, keep_torch_compile=False)
    compiled_alone = getattr(wrapped, "_orig_mod", None) is inner
    return wrapped if compiled_alone and precision == "auto" else inner
