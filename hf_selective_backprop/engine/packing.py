"""Packed (padding-free) batches for selection: split into sequences, scored packed, trained re-packed.

TRL's padding-free collator (``DataCollatorForLanguageModeling(padding_free=True)``, used by
``SFTTrainer`` with ``padding_free=True`` or ``packing=True`` and the ``bfd`` strategies) flattens a batch
into one row: ``input_ids`` and ``labels`` of shape [1, tokens], ``position_ids`` restarting at 0 at each
sequence, ``cu_seq_lens_q``/``cu_seq_lens_k`` (sequence starts, then the length), ``max_length_q``/
``max_length_k`` and ``seq_idx`` (the sequence of each token); the label of each sequence's first token
is -100, since the token before it belongs to another sequence.

Selection keeps or drops sequences, so at the engine's entry such a batch becomes `sequence_rows`: one
right-padded row per sequence (``input_ids``, ``attention_mask``, ``labels``, and a stable id per
sequence), which the engine, its queue and its checkpoints handle like any padded text batch. Two
places put the sequences back into one flattened row, in the collator's format (`packed_rows`):

- the selection forward (`PackedScorer`): the rows of a selection batch, re-packed, are the tokens of
  the batch as loaded, so scoring keeps packing's speed; each sequence's loss is read from the
  per-token losses between its boundaries (`per_sequence`);
- the training step: the sequences of a micro-batch popped from the queue are packed into one row, so
  training pays for the kept tokens only (packing's saving and selection's together).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import numpy
import torch
from torch.nn.utils.rnn import pad_sequence

IGNORE_INDEX = -100
#: What TRL's padding-free collator adds beside input_ids and labels.
PACKED_KEYS = ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


def is_packed(batch: Mapping) -> bool:
    """A padding-free batch: sequences flattened into one row and told apart by ``position_ids`` alone."""
    return "position_ids" in batch and "attention_mask" not in batch


def sequence_lengths(batch: Mapping, pad_token_id: int | None = None) -> list[int]:
    """The length of each sequence of a packed batch, from its ``position_ids`` restarts.

    A collator's ``pad_to_multiple_of`` pads the flattened row with ``position_ids`` 0, which its
    ``cu_seq_lens`` counts as one-token sequences: trailing one-token sequences of ``pad_token_id``
    with no label are that padding and are left out.
    """
    position_ids = batch["position_ids"]
    if position_ids.dim() != 2 or position_ids.shape[0] != 1:
        raise ValueError(
            f"a padding-free batch has one flattened row; its position_ids have shape {tuple(position_ids.shape)}"
        )
    positions = position_ids[0]
    starts = (positions == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        raise ValueError("a padding-free batch's position_ids must start at 0, as each sequence does")
    total = positions.numel()
    lengths = [end - start for start, end in zip(starts, [*starts[1:], total], strict=True)]
    if pad_token_id is not None:
        input_ids, labels = batch["input_ids"][0], batch["labels"][0]
        while len(lengths) > 1 and lengths[-1] == 1 and int(input_ids[total - 1]) == pad_token_id \
                and int(labels[total - 1]) == IGNORE_INDEX:
            lengths.pop()
            total -= 1
    return lengths


def sequence_rows(batch: Mapping, pad_token_id: int, ids: Sequence[int] | torch.Tensor | None = None,
                  id_column: str = "index") -> dict[str, torch.Tensor]:
    """A packed batch as one right-padded row per sequence: ``input_ids`` (``pad_token_id``),
    ``attention_mask`` and ``labels`` (-100), and ``ids`` (one per sequence) under ``id_column``."""
    unknown = set(batch) - {"input_ids", "labels", *PACKED_KEYS, id_column}
    if unknown:
        raise ValueError(
            f"the packed batch holds {sorted(unknown)} besides TRL's padding-free entries: selection splits a packed "
            "batch into its sequences and cannot tell how to split those"
        )
    lengths = sequence_lengths(batch, pad_token_id)
    used = sum(lengths)
    input_ids = batch["input_ids"][0, :used].split(lengths)
    labels = batch["labels"][0, :used].split(lengths)
    rows = {
        "input_ids": pad_sequence(input_ids, batch_first=True, padding_value=pad_token_id),
        "attention_mask": pad_sequence([torch.ones_like(t) for t in input_ids], batch_first=True, padding_value=0),
        "labels": pad_sequence(labels, batch_first=True, padding_value=IGNORE_INDEX),
    }
    if ids is not None:
        ids = torch.as_tensor(ids, dtype=torch.int64)
        if ids.numel() != len(lengths):
            raise ValueError(
                f"the packed batch holds {len(lengths)} sequences but {ids.numel()} ids came with it: selection needs "
                "one id per sequence"
            )
        rows[id_column] = ids
    return rows


def packed_rows(rows: Mapping[str, torch.Tensor], pad_token_id: int, pad_to_multiple_of: int | None = None,
                label_name: str = "labels") -> dict:
    """Right-padded rows, one sequence each, flattened into one row as TRL's padding-free collator does.

    The tokens of each row (``attention_mask`` 1) follow one another in row order; every other column
    (ids, weights: one value per sequence) passes through unchanged.
    """
    mask = rows["attention_mask"].bool()
    lengths = mask.sum(dim=1)
    input_ids = rows["input_ids"][mask]
    labels = rows[label_name][mask]
    starts = torch.cumsum(lengths, 0) - lengths
    position_ids = torch.arange(input_ids.numel(), device=input_ids.device) - starts.repeat_interleave(lengths)
    total = input_ids.numel()
    if pad_to_multiple_of:
        extra = -total % pad_to_multiple_of
        input_ids = torch.cat([input_ids, input_ids.new_full((extra,), pad_token_id)])
        labels = torch.cat([labels, labels.new_full((extra,), IGNORE_INDEX)])
        position_ids = torch.cat([position_ids, position_ids.new_zeros(extra)])
    labels = labels.clone()
    labels[position_ids == 0] = IGNORE_INDEX
    # As the collator computes them: every position 0 (padding included) starts a sequence.
    seq_starts = (position_ids == 0).nonzero().flatten()
    cu_seq_lens = torch.cat([seq_starts, seq_starts.new_tensor([position_ids.numel()])]).to(torch.int32)
    widths = cu_seq_lens.diff()
    max_length = int(widths.max())
    packed = {key: value for key, value in rows.items() if key not in ("input_ids", "attention_mask", label_name)}
    packed |= {
        "input_ids": input_ids[None],
        label_name: labels[None],
        "position_ids": position_ids[None],
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": max_length,
        "max_length_k": max_length,
        "seq_idx": torch.repeat_interleave(
            torch.arange(widths.numel(), dtype=torch.int32, device=widths.device), widths)[None],
    }
    return packed


def per_sequence(values: torch.Tensor, sequence_index: torch.Tensor, sequences: int) -> torch.Tensor:
    """Sums, per sequence, of shifted per-token ``values`` ([1, tokens - 1]: position t holds the loss of
    predicting token t + 1) of one packed row whose token t belongs to sequence ``sequence_index[0, t]``.
    Positions of the collator's padding (sequence numbers from ``sequences`` on) are left out."""
    owner = sequence_index.reshape(-1)[1:].long()
    values = values.reshape(-1)
    if owner.numel() != values.numel():
        raise ValueError(f"{values.numel()} shifted token values for a packed row of {owner.numel() + 1} tokens")
    inside = owner < sequences
    return values.new_zeros(sequences).index_add_(0, owner[inside], values[inside])


class PackedScorer:
    """The selection forward of rows split from packed batches: the rows packed again (the batch as loaded)
    and scored by ``scorer`` (a `SelectionScorer`), whose loss reads one loss per sequence while its
    ``sequences`` context is set (`SFTExampleLoss` does)."""

    def __init__(self, scorer, pad_token_id: int, pad_to_multiple_of: int | None = None):
        self.scorer, self.pad_token_id, self.pad_to_multiple_of = scorer, pad_token_id, pad_to_multiple_of

    def __getattr__(self, name: str):
        if name == "scorer":  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.scorer, name)

    def __call__(self, model: torch.nn.Module, inputs: dict, with_margins: bool = False):
        rows = inputs[self.scorer.label_name].shape[0]
        packed = packed_rows(inputs, self.pad_token_id, self.pad_to_multiple_of, self.scorer.label_name)
        with self.scorer.loss_fn.sequences(packed["seq_idx"], rows):
            return self.scorer(model, packed, with_margins)


class SequenceRowsCollator:
    """A padding-free collator whose batches come out as `sequence_rows`, with one id per sequence.

    Ids: a feature that is one example (``padding_free`` without packing) gives its id; a packed row
    (with TRL's ``seq_lengths``) gives ``first_sequence[id] + j`` to its j-th sequence, where
    ``first_sequence`` numbers all sequences of the dataset 0..S-1 in row order (`first_sequence_ids`).
    Batches that are not padding-free pass through unchanged.
    """

    def __init__(self, collator, pad_token_id: int, id_column: str, first_sequence: numpy.ndarray | None = None):
        self.collator, self.pad_token_id, self.id_column = collator, pad_token_id, id_column
        self.first_sequence = first_sequence

    def __call__(self, features: list[dict]) -> dict:
        batch = self.collator(features)
        if not is_packed(batch):
            return batch
        ids = None
        if features and isinstance(features[0], Mapping) and self.id_column in features[0]:
            if "seq_lengths" in features[0]:
                if self.first_sequence is None:
                    raise ValueError("packed rows need the dataset's sequence numbering (first_sequence)")
                ids = [int(self.first_sequence[int(f[self.id_column])]) + j
                       for f in features for j in range(len(f["seq_lengths"]))]
            else:
                ids = [int(f[self.id_column]) for f in features]
        batch = {key: value for key, value in batch.items() if key != self.id_column}
        return sequence_rows(batch, self.pad_token_id, ids, self.id_column)


def sequence_counts(dataset) -> numpy.ndarray | None:
    """For a packed `datasets.Dataset` (a ``seq_lengths`` list per row): the number of sequences in each row, read
    from Arrow's list offsets (no Python loop over rows); None for unpacked data."""
    if "seq_lengths" not in getattr(dataset, "column_names", ()):
        return None
    import pyarrow.compute as pc

    lengths = dataset.with_format("arrow")["seq_lengths"]
    return pc.list_value_length(lengths).to_numpy(zero_copy_only=False).astype(numpy.int64)


def first_sequence_ids(dataset, id_column: str) -> numpy.ndarray | None:
    """For a packed `datasets.Dataset` (a ``seq_lengths`` list per row): the number of its first sequence,
    indexed by row id, when all sequences are numbered 0..S-1 in row order; None for unpacked data."""
    counts = sequence_counts(dataset)
    if counts is None:
        return None
    from .indexing import ids_by_position

    ids = ids_by_position(dataset, id_column).numpy()
    first = numpy.zeros(int(ids.max()) + 1 if ids.size else 0, dtype=numpy.int64)
    first[ids] = numpy.cumsum(counts) - counts
    return first


@contextlib.contextmanager
def swapped(obj, name: str, value):
    """``obj.name`` set to ``value`` for the duration."""
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)
