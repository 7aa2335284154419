"""Rows in, full micro-batches out: Algorithm 1's backprop queue."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch
import torch.nn.functional as F

PADDING_SIDES = ("right", "left")


class BatchQueue:
    """Holds selected rows (a dict of equal-length tensors) until a full batch is ready.

    Rows are kept as chunks and concatenated only when a batch is popped, so a selection
    batch costs one gather and no per-example work.

    Args:
        pad_values: for variable-length rows (tokenized text), the value each sequence column is
            padded with, e.g. ``{"input_ids": tokenizer.pad_token_id, "attention_mask": 0,
            "labels": -100}``. These columns share one sequence dimension (dim 1) whose width may
            differ from one pushed batch to the next; a popped batch is padded to its own longest
            row. Columns not named here must have the same shape per row in every batch.
        padding_side: where the padding sits, ``"right"`` or ``"left"`` (the tokenizer's).
        pad_to_multiple_of: round a popped batch's width up to a multiple of this (as the data
            collator's option of the same name does, for tensor cores).
        sequence_groups: for padded columns with a sequence dimension of their own, the name of
            the group that shares it, e.g. an encoder-decoder's ``{"labels": "decoder",
            "decoder_input_ids": "decoder"}`` beside the source text; unnamed columns share one.
        derived_columns: padded columns computed from others of their group, which do not decide
            where a row's padding starts: decoder inputs are the labels shifted right, so their last
            token is the label before the last one.
    """

    def __init__(
        self,
        pad_values: Mapping[str, float] | None = None,
        padding_side: str = "right",
        pad_to_multiple_of: int | None = None,
        sequence_groups: Mapping[str, str] | None = None,
        derived_columns: Collection[str] = (),
    ):
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be one of {', '.join(PADDING_SIDES)}, got {padding_side!r}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        self.pad_values = dict(pad_values or {})
        self.padding_side = padding_side
        self.pad_to_multiple_of = pad_to_multiple_of
        self.sequence_groups = dict(sequence_groups or {})
        self.derived_columns = frozenset(derived_columns)
        self._chunks: list[dict[str, torch.Tensor]] = []
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    def push(self, rows: dict[str, torch.Tensor]) -> None:
        lengths = {key: value.shape[0] for key, value in rows.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"rows of unequal length: {lengths}")
        n = next(iter(lengths.values()), 0)
        if n == 0:
            return
        if self._chunks and rows.keys() != self._chunks[0].keys():
            raise ValueError(f"columns {sorted(rows)} differ from queued {sorted(self._chunks[0])}")
        self._check_sequence_columns(rows)
        for key, value in rows.items():
            # A sequence column may change width between batches; what follows it may not.
            first = 2 if key in self.pad_values else 1
            if self._chunks and value.shape[first:] != self._chunks[0][key].shape[first:]:
                raise ValueError(
                    f"column {key!r} has rows of shape {tuple(value.shape[1:])} here and "
                    f"{tuple(self._chunks[0][key].shape[1:])} in the queue: selection batches rows from several "
                    "selection batches together, so every batch must have the same shape per row (pad "
                    "variable-length inputs to a fixed length, e.g. padding='max_length', or pass the tokenizer "
                    "to the Trainer as processing_class so each training batch is padded again)"
                )
        self._chunks.append(rows)
        self._rows += n

    def _group_of(self, key: str) -> str:
        return self.sequence_groups.get(key, "")

    def _groups(self, keys) -> dict[str, list[str]]:
        """The padded columns among ``keys``, by the sequence dimension they share."""
        groups: dict[str, list[str]] = {}
        for key in self.pad_values:
            if key in keys:
                groups.setdefault(self._group_of(key), []).append(key)
        return groups

    def _check_sequence_columns(self, rows: dict[str, torch.Tensor]) -> None:
        for keys in self._groups(rows).values():
            self._check_group(rows, keys)

    def _check_group(self, rows: dict[str, torch.Tensor], keys: list[str]) -> None:
        widths = {}
        for key in keys:
            if key not in rows:
                continue
            if rows[key].dim() < 2:
                raise ValueError(
                    f"column {key!r} has shape {tuple(rows[key].shape)}: a padded column needs a sequence "
                    "dimension (batch, length, ...)"
                )
            widths[key] = rows[key].shape[1]
        if len(set(widths.values())) > 1:
            raise ValueError(
                f"padded columns have different lengths {widths}: they must share one sequence dimension, "
                "as the columns of one tokenized input do"
            )

    def pop(self, n: int) -> dict[str, torch.Tensor]:
        """Exactly ``n`` rows, oldest first; sequence columns padded to the longest of them."""
        if n < 1 or n > self._rows:
            raise ValueError(f"cannot pop {n} rows from a queue of {self._rows}")
        taken, size = [], 0
        while size < n:
            chunk = self._chunks.pop(0)
            length = next(iter(chunk.values())).shape[0]
            need = n - size
            if length > need:
                taken.append({k: v[:need] for k, v in chunk.items()})
                self._chunks.insert(0, {k: v[need:] for k, v in chunk.items()})
                size += need
            else:
                taken.append(chunk)
                size += length
        self._rows -= n
        return self._trim(self._concatenate(taken))

    def _concatenate(self, chunks: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if len(chunks) == 1:
            return chunks[0]
        widths = self._common_width(chunks)
        return {key: torch.cat([self._pad_to(key, c[key], widths) for c in chunks]) for key in chunks[0]}

    def _common_width(self, chunks: list[dict[str, torch.Tensor]]) -> dict[str, int]:
        """The widest row of each group of padded columns."""
        widths: dict[str, int] = {}
        for chunk in chunks:
            for group, keys in self._groups(chunk).items():
                widths[group] = max(widths.get(group, 0), chunk[keys[0]].shape[1])
        return widths

    def _pad_to(self, key: str, value: torch.Tensor, widths: dict[str, int]) -> torch.Tensor:
        if key not in self.pad_values:
            return value
        width = widths[self._group_of(key)]
        if value.shape[1] == width:
            return value
        extra = width - value.shape[1]
        # F.pad counts dimensions from the last; the sequence dimension is dim 1.
        before = [0, 0] * (value.dim() - 2)
        sides = [extra, 0] if self.padding_side == "left" else [0, extra]
        return F.pad(value, before + sides, value=self.pad_values[key])

    def _trim(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Drop the columns that are padding in every row: selection leaves some short rows together."""
        for keys in self._groups(batch).values():
            batch = self._trim_group(batch, keys)
        return batch

    def _trim_group(self, batch: dict[str, torch.Tensor], keys: list[str]) -> dict[str, torch.Tensor]:
        width = batch[keys[0]].shape[1]
        real = torch.zeros(width, dtype=torch.bool, device=batch[keys[0]].device)
        for key in [key for key in keys if key not in self.derived_columns] or keys:
            # A column is real where any padded input differs from its pad value: the attention
            # mask marks real tokens even where input_ids hold the pad id (e.g. pad = eos).
            differs = batch[key] != self.pad_values[key]
            real |= differs.reshape(differs.shape[0], width, -1).any(dim=2).any(dim=0)
        positions = real.nonzero()
        if self.padding_side == "right":
            keep = int(positions[-1]) + 1 if len(positions) else 0
        else:
            keep = width - int(positions[0]) if len(positions) else 0
        if self.pad_to_multiple_of:
            keep = -(-keep // self.pad_to_multiple_of) * self.pad_to_multiple_of
        keep = max(min(keep, width), 1)
        if keep == width:
            return batch
        columns = slice(0, keep) if self.padding_side == "right" else slice(width - keep, width)
        # Contiguous: a model may view() its labels (T5 does), which a column slice does not allow.
        return {key: value[:, columns].contiguous() if key in keys else value for key, value in batch.items()}

    def clear(self) -> None:
        self._chunks, self._rows = [], 0

    def state_dict(self) -> dict:
        if not self._chunks:
            return {"rows": {}}
        widths = self._common_width(self._chunks)
        merged = {k: torch.cat([self._pad_to(k, c[k], widths) for c in self._chunks]).cpu() for k in self._chunks[0]}
        return {"rows": merged}

    def load_state_dict(self, state: dict) -> None:
        self.clear()
        self.push(state["rows"])
