"""Ring buffer of recent losses: the empirical CDF that Selective-Backprop scores against."""

from __future__ import annotations

import torch


class LossHistory:
    """The ``size`` most recent finite losses, with a vectorised empirical CDF.

    The paper keeps a bounded deque and computes one percentile per example in Python; a
    fixed tensor written at a moving offset and scored with ``searchsorted`` gives the same
    numbers for a whole batch at once.
    """

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"history size must be >= 1, got {size}")
        self.size = size
        self._buffer = torch.empty(size, dtype=torch.float32)
        self._next = 0
        self._filled = 0

    def __len__(self) -> int:
        return self._filled

    def add(self, losses: torch.Tensor) -> None:
        """Append losses (oldest first); non-finite values never enter the history."""
        losses = losses.detach().reshape(-1).float().cpu()
        losses = losses[torch.isfinite(losses)][-self.size :]
        n = losses.numel()
        if n == 0:
            return
        end = self._next + n
        if end <= self.size:
            self._buffer[self._next : end] = losses
        else:
            split = self.size - self._next
            self._buffer[self._next :] = losses[:split]
            self._buffer[: n - split] = losses[split:]
        self._next = end % self.size
        self._filled = min(self._filled + n, self.size)

    def values(self) -> torch.Tensor:
        """The stored losses, oldest first."""
        if self._filled < self.size:
            return self._buffer[: self._filled].clone()
        return torch.cat([self._buffer[self._next :], self._buffer[: self._next]])

    def cdf(self, losses: torch.Tensor) -> torch.Tensor:
        """Fraction of the history that is <= each loss (0 for an empty history)."""
        losses = losses.detach().reshape(-1).float().cpu()
        if self._filled == 0:
            return torch.zeros_like(losses)
        ordered = torch.sort(self._buffer[: self._filled]).values
        return torch.searchsorted(ordered, losses, right=True).float() / self._filled

    def state_dict(self) -> dict:
        return {"size": self.size, "values": self.values()}

    def load_state_dict(self, state: dict) -> None:
        self.__init__(int(state["size"]))
        self.add(state["values"])
