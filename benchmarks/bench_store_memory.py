"""Peak memory of the Stale-SB loss store for a large dataset.

    python benchmarks/bench_store_memory.py [--examples 1000000] [--batch 1024] [--updates 3000]

Builds a `LossStore`, fills every id once in shuffled batches (a scoring epoch), then applies
``--updates`` batches of random ids (training-forward refreshes), then saves it as a checkpoint
does. Prints the peak resident-memory increase of each phase over the memory held before the store
existed, in bytes and bytes per example. Peak RSS is VmHWM from /proc/self/status, reset between
phases through /proc/self/clear_refs; without /proc it falls back to getrusage (no reset).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import torch

from hf_selective_backprop.engine.store import LossStore


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss() -> int:
    value = _status_bytes("VmRSS")
    return value if value is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss() -> int:
    value = _status_bytes("VmHWM")
    return value if value is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> bool:
    """Set the peak to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--updates", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-reserve", action="store_true",
        help="start from an empty store that grows with the ids seen, instead of LossStore(capacity) as the "
        "trainer creates it for a map-style dataset",
    )
    options = parser.parse_args()
    torch.set_num_threads(1)
    n, batch = options.examples, options.batch
    generator = torch.Generator().manual_seed(options.seed)
    order = torch.randperm(n, generator=generator)  # the sampler's order: data, not store
    # Touch every code path once on a tiny store: first-call costs (library pages, allocator pools)
    # are per process, not per example.
    warm = LossStore()
    warm.update(torch.tensor([3, 1, 3]), torch.rand(3, generator=generator), epoch=0)
    warm.lookup(torch.arange(4))
    torch.randint(0, n, (batch,), generator=generator)
    del warm
    resettable = reset_peak()
    base = current_rss()

    start = time.perf_counter()
    store = LossStore() if options.no_reserve else LossStore(n)
    for epoch_ids in order.split(batch):
        store.update(epoch_ids, torch.rand(epoch_ids.numel(), generator=generator), epoch=0)
    fill_seconds = time.perf_counter() - start
    fill_peak = peak_rss() - base
    held = current_rss() - base

    reset_peak()
    start = time.perf_counter()
    for _ in range(options.updates):
        ids = torch.randint(0, n, (batch,), generator=generator)
        store.update(ids, torch.rand(batch, generator=generator), epoch=1)
    update_seconds = time.perf_counter() - start
    update_peak = peak_rss() - base

    reset_peak()
    with tempfile.TemporaryDirectory() as folder:  # as a checkpoint saves it (sb_state.pt)
        path = os.path.join(folder, "store.pt")
        torch.save(store.state_dict(), path)
        saved = os.path.getsize(path)
    save_peak = peak_rss() - base

    tensors = store.losses.nbytes + store.epochs.nbytes
    print(f"examples                    {n:,} ({'grown from empty' if options.no_reserve else 'reserved'})")
    print(f"store tensors               {tensors:,} B  ({tensors / n:.1f} B/example: float32 loss + int64 epoch)")
    print(f"RSS held after filling      {held:,} B  ({held / n:.1f} B/example)")
    print(f"peak RSS increase, filling  {fill_peak:,} B  ({fill_peak / n:.1f} B/example)")
    print(f"peak RSS increase, updates  {update_peak:,} B  ({update_peak / n:.1f} B/example)")
    print(f"peak RSS increase, saving   {save_peak:,} B  ({save_peak / n:.1f} B/example; {saved:,} B serialised)")
    print(f"fill {fill_seconds * 1e6 / len(order.split(batch)):.0f} us/batch, "
          f"update {update_seconds * 1e6 / max(options.updates, 1):.0f} us/batch of {batch}")
    if not resettable:
        print("(no /proc/self/clear_refs: peaks are process-lifetime maxima)")


if __name__ == "__main__":
    main()
