"""Properties (hypothesis) of the queue, the loss store, the loss history and the whole trainer.

- BatchQueue: for any stream of pushes and pops it is a FIFO of rows: no row lost, duplicated or
  reordered, rows stay intact, and a trainer-style consumer never gets a short batch.
- LossStore: holds the last finite loss (and its epoch) per id, whatever the order, duplicates or
  non-finite values of the updates; its memory is two flat tensors of max_id + 1 slots.
- LossHistory: holds exactly the last R finite values pushed; its CDF is the brute-force one.
- Trainer: every kept id is kept at most once per epoch (one process: no sampler padding), training
  micro-batches are full and are the kept rows in order, and backwards == kept - queued at the end.
"""

from __future__ import annotations

import math
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny import TinyClassifier, make_config, make_dataset

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.engine.queue import BatchQueue
from hf_selective_backprop.engine.store import LossStore
from hf_selective_backprop.selectors.history import LossHistory

floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True)


def _rows(ids: torch.Tensor, width: int) -> dict[str, torch.Tensor]:
    # Every column is derived from the row's id, so a mixed-up row is detectable.
    return {"index": ids, "x": ids[:, None].float() * torch.arange(1, width + 1), "labels": ids % 3}


def _check_rows(rows: dict[str, torch.Tensor], width: int) -> None:
    assert torch.equal(rows["x"], _rows(rows["index"], width)["x"])
    assert torch.equal(rows["labels"], rows["index"] % 3)


# ---- BatchQueue -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.integers(0, 12)),
            st.tuples(st.just("pop"), st.integers(1, 10)),
            st.tuples(st.just("save"), st.just(0)),
        ),
        max_size=40,
    ),
    width=st.integers(1, 3),
)
def test_queue_is_a_fifo_of_whole_rows(ops, width):
    queue, expected, next_id = BatchQueue(), [], 0
    for op, n in ops:
        if op == "push":
            queue.push(_rows(torch.arange(next_id, next_id + n), width))
            expected += list(range(next_id, next_id + n))
            next_id += n
        elif op == "pop":
            if n > len(expected):
                with pytest.raises(ValueError):
                    queue.pop(n)
                continue
            rows = queue.pop(n)
            assert rows["index"].tolist() == expected[:n]
            _check_rows(rows, width)
            del expected[:n]
        else:  # a checkpoint round trip in the middle of the stream
            state = queue.state_dict()
            queue = BatchQueue()
            queue.load_state_dict(state)
        assert len(queue) == len(expected)


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    selection_batches=st.lists(st.integers(1, 20), max_size=25),
    batch=st.integers(1, 8),
    accumulation=st.integers(1, 3),
)
def test_queue_feeds_only_full_micro_batches_in_selection_order(data, selection_batches, batch, accumulation):
    queue, kept, trained, next_id = BatchQueue(), [], [], 0
    for size in selection_batches:
        ids = torch.arange(next_id, next_id + size)
        next_id += size
        mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=size, max_size=size)))
        selected = ids[mask]  # what a selector keeps: a subset, in order
        queue.push(_rows(selected, 2))
        kept += selected.tolist()
        while len(queue) >= batch * accumulation:  # the trainer's rule: a whole step or nothing
            for _ in range(accumulation):
                rows = queue.pop(batch)
                assert rows["index"].numel() == batch
                _check_rows(rows, 2)
                trained += rows["index"].tolist()
    assert len(queue) < batch * accumulation
    assert trained == kept[: len(trained)]
    assert len(trained) == len(kept) - len(queue)
    if len(queue):
        assert queue.pop(len(queue))["index"].tolist() == kept[len(trained) :]


# ---- LossStore ---------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(updates=st.lists(st.lists(st.tuples(st.integers(0, 40), floats32), max_size=15), max_size=12))
def test_store_keeps_the_last_finite_loss_per_id(updates):
    store, expected = LossStore(), {}
    for epoch, update in enumerate(updates):
        ids = torch.tensor([i for i, _ in update], dtype=torch.int64)
        losses = torch.tensor([v for _, v in update], dtype=torch.float32)
        store.update(ids, losses, epoch)
        for i, value in update:
            if math.isfinite(value):
                expected[i] = (value, epoch)
    assert len(store) == (max(expected) + 1 if expected else 0)
    losses, epochs = store.lookup(torch.arange(50))
    for i in range(50):
        if i in expected:
            assert losses[i].item() == expected[i][0] and epochs[i].item() == expected[i][1]
        else:
            assert math.isnan(losses[i].item()) and epochs[i].item() == -1
    restored = LossStore()
    restored.load_state_dict(store.state_dict())
    torch.testing.assert_close(restored.losses, store.losses, rtol=0, atol=0, equal_nan=True)


def test_store_memory_is_two_flat_tensors_of_max_id_plus_one_slots():
    store = LossStore()
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        ids = torch.randint(0, 200_000, (1024,), generator=generator)
        store.update(ids, torch.rand(1024, generator=generator), epoch=3)
    ids = torch.tensor([199_999, 7])
    store.update(ids, torch.ones(2), epoch=4)
    assert {name: type(value) for name, value in vars(store).items()} == dict(losses=torch.Tensor, epochs=torch.Tensor)
    assert store.losses.dtype == torch.float32 and store.epochs.dtype == torch.int64
    assert store.losses.shape == store.epochs.shape == (200_000,)
    assert store.losses.is_contiguous() and store.epochs.is_contiguous()
    assert store.losses.nbytes + store.epochs.nbytes == 12 * 200_000
    state = store.state_dict()
    assert all(isinstance(value, torch.Tensor) for value in state.values())


# ---- LossHistory -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 16), pushes=st.lists(st.lists(floats32, max_size=20), max_size=10), probe=floats32)
def test_history_is_the_last_r_finite_losses(size, pushes, probe):
    history = LossHistory(size)
    for push in pushes:
        history.add(torch.tensor(push, dtype=torch.float32))
    finite = [v for push in pushes for v in push if math.isfinite(v)]
    expected = finite[-size:] if finite else []
    assert history.values().tolist() == expected
    assert len(history) == len(expected)
    if expected and math.isfinite(probe):
        probes = torch.tensor(expected + [probe], dtype=torch.float32)
        brute = torch.tensor([sum(v <= p for v in expected) / len(expected) for p in probes.tolist()])
        assert torch.equal(history.cdf(probes), brute)
    restored = LossHistory(1)
    restored.load_state_dict(history.state_dict())
    assert restored.values().tolist() == expected and restored.size == size


# ---- the trainer end to end ------------------------------------------------------------------


class IndexedClassifier(TinyClassifier):
    """Accepts (and ignores) the index column, so a plain-Trainer run ('none') keeps it too."""

    def forward(self, pixel_values, labels=None, index=None):
        return super().forward(pixel_values, labels)


class RecordingTrainer(SelectiveBackpropTrainer):
    """Records the ids of every training micro-batch and of every row queued, by epoch."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.trained = getattr(self, "trained", [])
        self.trained.append(inputs["index"].clone())  # before compute_loss pops it
        return super().training_step(model, inputs, num_items_in_batch)

    def _build_engine(self):
        engine = super()._build_engine()
        self.kept = getattr(self, "kept", [])
        add_batch = engine.add_batch

        def recording_add_batch(batch, selecting, model):
            queue, pushed = engine.queue, []
            push = queue.push
            queue.push = lambda rows: (pushed.append(rows["index"].clone()), push(rows))
            try:
                add_batch(batch, selecting, model)
            finally:
                del queue.push
            self.kept.append((engine.epoch, torch.cat(pushed) if pushed else torch.zeros(0, dtype=torch.int64)))

        engine.add_batch = recording_add_batch
        return engine


N, EPOCHS = 40, 2


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    batch=st.sampled_from([2, 4]),
    selection=st.sampled_from([None, 3, 5]),
    accumulation=st.sampled_from([1, 2]),
    strategy=st.sampled_from(["sb", "none"]),
    min_prob=st.sampled_from([0.5, 0.9]),
    staleness=st.sampled_from([1, 2]),
)
def test_trainer_trains_kept_rows_once_per_epoch_in_full_batches(
    batch, selection, accumulation, strategy, min_prob, staleness
):
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = RecordingTrainer(
            model=IndexedClassifier(),
            train_dataset=make_dataset(N, with_index=True),
            args=make_config(
                output_dir, num_train_epochs=EPOCHS, per_device_train_batch_size=batch,
                gradient_accumulation_steps=accumulation, sb_strategy=strategy, sb_beta=1.0, sb_min_prob=min_prob,
                sb_selection_batch_size=selection, sb_staleness=staleness,
            ),
        )
        trainer.train()
    trained = torch.cat(trainer.trained)
    if strategy == "none":  # the plain Trainer: every example exactly once per epoch
        for epoch in range(EPOCHS):
            assert sorted(trained[epoch * N : (epoch + 1) * N].tolist()) == list(range(N))
        assert trained.numel() == EPOCHS * N
        return
    for epoch in range(EPOCHS):
        ids = torch.cat([ids for e, ids in trainer.kept if e == epoch])
        assert ids.unique().numel() == ids.numel(), f"an id kept twice in epoch {epoch}"
        assert 0 <= int(ids.min()) and int(ids.max()) < N
    kept = torch.cat([ids for _, ids in trainer.kept])
    assert {len(ids) for ids in trainer.trained} == {batch}
    assert len(trainer.trained) == accumulation * trainer.state.global_step
    assert torch.equal(trained, kept[: trained.numel()])  # FIFO: trained rows are the kept rows in order
    stats = trainer.sb_stats
    assert stats["backwards"] == trained.numel() == kept.numel() - len(trainer.engine.queue)
    assert stats["examples_seen"] == EPOCHS * N


def test_trainer_sizes_the_store_for_the_largest_id_before_training(output_dir):
    ids = [3 * i for i in range(50)]
    data = make_dataset(50, with_index=True).remove_columns("index").add_column("index", ids)
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=data,
                                       args=make_config(output_dir, sb_strategy="sb", sb_staleness=2))
    trainer.get_train_dataloader()
    assert len(trainer.engine.store) == max(ids) + 1  # one allocation, not one per larger id seen
    assert bool(torch.isnan(trainer.engine.store.losses).all())
