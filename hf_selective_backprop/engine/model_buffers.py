"""Each process's own model buffers (BatchNorm running statistics, ...), saved with its checkpoint state.

DDP copies rank 0's buffers to the other ranks only at the start of a training forward; in between, each rank's
own training forward has updated its copy, and the selection forwards of the next step use it. The Trainer's
checkpoint holds rank 0's model only, so without these a resumed rank scores its first selection batches with
rank 0's statistics and selects other rows.
"""

from __future__ import annotations

import torch


def model_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's saved buffers as this process holds them, copied to the host."""
    saved = model.state_dict().keys()
    return {name: value.detach().cpu().clone() for name, value in model.named_buffers() if name in saved}


class ResumedBuffers:
    """The buffers this process saved, from the checkpoint a run resumed from, until they are put back."""

    def __init__(self):
        self.saved: dict[str, torch.Tensor] | None = None

    def restore(self, model: torch.nn.Module) -> None:
        """Put the saved buffers back into ``model`` (the unwrapped model), once after a resume.

        Called after the model is wrapped: wrapping it in DDP copies rank 0's buffers to every rank.
        """
        saved, self.saved = self.saved, None
        if not saved:
            return
        buffers = dict(model.named_buffers())
        with torch.no_grad():
            for name, value in saved.items():
                if name in buffers:
                    buffers[name].copy_(value)
