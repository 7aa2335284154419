"""BatchQueue with variable-length rows: every micro-batch re-padded to its own longest row."""

import pytest
import torch

from hf_selective_backprop.engine.padding import queue_padding
from hf_selective_backprop.engine.queue import BatchQueue

PAD_ID = 7
PAD_VALUES = {"input_ids": PAD_ID, "attention_mask": 0, "labels": -100, "features": -1.0}


def row_tokens(index: int, length: int) -> torch.Tensor:
    # Never the pad id, so a wrong pad value or a cut-off token shows.
    return torch.arange(length) + 100 * (index + 1)


def make_batch(indices, lengths, width, side="right"):
    """A collator-style batch: each row padded to ``width`` with PAD_VALUES on ``side``."""
    n = len(indices)
    batch = {
        "input_ids": torch.full((n, width), PAD_ID),
        "attention_mask": torch.zeros(n, width, dtype=torch.long),
        "labels": torch.full((n, width), -100),
        "features": torch.full((n, width, 2), -1.0),
        "index": torch.tensor(indices),
        "label_id": torch.tensor(indices) % 3,
    }
    for row, (index, length) in enumerate(zip(indices, lengths, strict=True)):
        columns = slice(0, length) if side == "right" else slice(width - length, width)
        tokens = row_tokens(index, length)
        batch["input_ids"][row, columns] = tokens
        batch["attention_mask"][row, columns] = 1
        batch["labels"][row, columns] = tokens % 5
        batch["features"][row, columns] = tokens.float().unsqueeze(1).expand(length, 2)
    return batch


def expected_rows(batch, lengths, side):
    """The rows of ``batch`` as they must come out: re-padded to the longest of them."""
    indices = batch["index"].tolist()
    return make_batch(indices, [lengths[i] for i in indices], max(lengths[i] for i in indices), side)


@pytest.mark.parametrize("side", ["right", "left"])
def test_rows_of_different_lengths_come_out_full_repadded_and_untruncated(side):
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 30, (60,), generator=generator).tolist()
    queue = BatchQueue(pad_values=PAD_VALUES, padding_side=side)
    start = 0
    for size in (7, 13, 5, 11, 9, 15):  # selection batches of several sizes, each padded to its own longest row
        indices = list(range(start, start + size))
        queue.push(make_batch(indices, [lengths[i] for i in indices], max(lengths[i] for i in indices) + 2, side))
        start += size
    assert len(queue) == 60
    popped = [queue.pop(4) for _ in range(15)]
    assert len(queue) == 0
    assert torch.equal(torch.cat([batch["index"] for batch in popped]), torch.arange(60))
    for batch in popped:
        expected = expected_rows(batch, lengths, side)
        assert batch.keys() == expected.keys()
        for key, value in expected.items():
            assert torch.equal(batch[key], value), key
        # No wasted column: some row of the micro-batch fills it.
        assert batch["input_ids"].shape[1] == max(lengths[i] for i in batch["index"].tolist())


def test_pop_that_takes_part_of_one_batch_is_trimmed_to_those_rows():
    queue = BatchQueue(pad_values=PAD_VALUES)
    queue.push(make_batch([0, 1, 2], [3, 4, 12], width=12))
    first = queue.pop(2)
    assert first["input_ids"].shape == (2, 4)
    assert first["features"].shape == (2, 4, 2)
    assert queue.pop(1)["input_ids"].shape == (1, 12)


def test_pad_id_inside_a_row_is_kept_where_the_attention_mask_says_real():
    # GPT-2 style: pad id = eos, and a row ends with a real eos.
    queue = BatchQueue(pad_values={"input_ids": 0, "attention_mask": 0})
    queue.push({"input_ids": torch.tensor([[5, 6, 0, 0, 0], [5, 0, 0, 0, 0]]),
                "attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])})
    batch = queue.pop(2)
    assert torch.equal(batch["input_ids"], torch.tensor([[5, 6, 0], [5, 0, 0]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1, 1], [1, 0, 0]]))


def test_pad_to_multiple_of_rounds_the_width_up():
    queue = BatchQueue(pad_values=PAD_VALUES, pad_to_multiple_of=8)
    queue.push(make_batch([0, 1], [3, 5], width=16))
    queue.push(make_batch([2, 3], [9, 2], width=16))
    assert queue.pop(2)["input_ids"].shape == (2, 8)
    assert queue.pop(2)["input_ids"].shape == (2, 16)


@pytest.mark.parametrize("side", ["right", "left"])
def test_state_dict_round_trips_rows_of_different_widths(side):
    lengths = [2, 9, 4, 4, 1, 6, 3]
    queue = BatchQueue(pad_values=PAD_VALUES, padding_side=side)
    queue.push(make_batch([0, 1, 2], lengths[:3], width=9, side=side))
    queue.push(make_batch([3, 4, 5, 6], lengths[3:], width=6, side=side))
    restored = BatchQueue(pad_values=PAD_VALUES, padding_side=side)
    restored.load_state_dict(queue.state_dict())
    assert len(restored) == 7
    for n in (2, 4, 1):
        original, copy = queue.pop(n), restored.pop(n)
        for key in original:
            assert torch.equal(original[key], copy[key]), key


def test_fixed_shape_columns_still_must_match():
    queue = BatchQueue(pad_values=PAD_VALUES)
    queue.push(make_batch([0], [3], width=4))
    bad = make_batch([1], [3], width=4)
    bad["label_id"] = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"column 'label_id' has rows of shape \(2,\)"):
        queue.push(bad)


def test_padded_columns_must_share_the_sequence_dimension():
    queue = BatchQueue(pad_values={"input_ids": 0, "labels": -100})
    with pytest.raises(ValueError, match=r"different lengths \{'input_ids': 4, 'labels': 3\}"):
        queue.push({"input_ids": torch.ones(2, 4, dtype=torch.long), "labels": torch.ones(2, 3, dtype=torch.long)})
    with pytest.raises(ValueError, match="'labels' has shape \\(2,\\): a padded column needs a sequence dimension"):
        queue.push({"input_ids": torch.ones(2, 4, dtype=torch.long), "labels": torch.ones(2, dtype=torch.long)})


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="padding_side must be one of right, left"):
        BatchQueue(pad_values=PAD_VALUES, padding_side="middle")
    with pytest.raises(ValueError, match="pad_to_multiple_of must be >= 1"):
        BatchQueue(pad_values=PAD_VALUES, pad_to_multiple_of=0)


class FakeTokenizer:
    pad_token_id, pad_token_type_id, padding_side = 3, 0, "left"


class FakeCollator:
    tokenizer, pad_to_multiple_of, label_pad_token_id = FakeTokenizer(), 8, -1


def test_queue_padding_reads_the_tokenizer_and_collator():
    padding = queue_padding(FakeCollator(), None, token_labels=True)
    assert padding == {
        "pad_values": {"input_ids": 3, "attention_mask": 0, "token_type_ids": 0, "special_tokens_mask": 1,
                       "labels": -1},
        "padding_side": "left",
        "pad_to_multiple_of": 8,
    }
    # Sequence labels are padded only when they are token labels; the tokenizer may come from processing_class.
    assert "labels" not in queue_padding(None, FakeTokenizer())["pad_values"]
    # No tokenizer (or one without a pad token): rows must have a fixed shape.
    assert queue_padding(None, None) == {}


def test_groups_of_padded_columns_keep_sequence_lengths_of_their_own():
    """An encoder-decoder's targets are padded apart from its sources; decoder inputs follow the labels."""
    padding = queue_padding(FakeCollator(), None, token_labels=True, encoder_decoder=True)
    queue = BatchQueue(**{**padding, "padding_side": "right", "pad_to_multiple_of": None})
    # Sources 4 wide, targets 2 wide; then sources 2 wide, targets 5 wide.
    queue.push({"input_ids": torch.tensor([[5, 6, 7, 8]]), "attention_mask": torch.ones(1, 4, dtype=torch.long),
                "labels": torch.tensor([[9, 10]]), "decoder_input_ids": torch.tensor([[3, 9]])})
    queue.push({"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.ones(1, 2, dtype=torch.long),
                "labels": torch.tensor([[9, 10, 11, -1, -1]]), "decoder_input_ids": torch.tensor([[3, 9, 10, 11, 3]])})
    batch = queue.pop(2)
    assert torch.equal(batch["input_ids"], torch.tensor([[5, 6, 7, 8], [5, 6, 3, 3]]))
    # The targets' width is the longest label (3), not the last decoder input (a shifted label, here 3).
    assert torch.equal(batch["labels"], torch.tensor([[9, 10, -1], [9, 10, 11]]))
    assert torch.equal(batch["decoder_input_ids"], torch.tensor([[3, 9, 3], [3, 9, 10]]))
