"""Symmetric label noise (the paper's robustness experiment: 1 %, 10 %, 20 % flipped) and holdout splits."""

from __future__ import annotations

import numpy as np
import torch

#: Stream key of the holdout draw. Label noise draws ``randperm(N)`` from the bare seed; the holdout drew the same
#: permutation when its seed equalled the noise's, so it held out exactly the flipped rows (at 20 % noise the
#: reference model saw only wrong labels and the main run almost none).
_HOLDOUT_STREAM = 0x686F6C646F7574  # "holdout"


def flip_labels(
    labels: torch.Tensor, fraction: float, num_classes: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flip exactly ``round(fraction * N)`` labels, each to a uniformly random *other* class.

    Returns the new labels and the sorted positions that were flipped. The same seed flips
    the same examples to the same classes, so every strategy of a comparison sees one
    noisy dataset.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"label noise fraction must be in [0, 1), got {fraction}")
    count = round(fraction * labels.numel())
    if count and num_classes < 2:
        raise ValueError("label noise needs at least 2 classes")
    generator = torch.Generator().manual_seed(seed)
    flipped = torch.randperm(labels.numel(), generator=generator)[:count].sort().values
    # A shift of 1..K-1 classes (mod K) is uniform over the K-1 wrong classes.
    shift = torch.randint(1, max(num_classes, 2), (count,), generator=generator)
    noisy = labels.clone()
    noisy[flipped] = (labels[flipped] + shift) % num_classes
    return noisy, flipped


def holdout_positions(size: int, fraction: float, seed: int) -> torch.Tensor:
    """Sorted positions of ``round(fraction * size)`` rows drawn without replacement with ``seed``.

    The same arguments always give the same rows, so a reference model trained on them and a main
    run trained on the others never share a row. The draw is independent of `flip_labels` for every pair of
    seeds, so the holdout carries the label noise at the same rate as the rest.
    """
    count = round(fraction * size)
    if fraction and not 0 < count < size:
        raise ValueError(
            f"--holdout_fraction {fraction} of {size} training rows holds out {count}: both the holdout and the rest "
            "need at least one row"
        )
    return torch.randperm(size, generator=stream_generator(_HOLDOUT_STREAM, seed))[:count].sort().values


def stream_generator(stream: int, seed: int) -> torch.Generator:
    """A generator for the draw named ``stream``, independent of `flip_labels`' (and every other stream's) for every
    pair of seeds: two draws seeded alike from the bare seed would take the same permutation of the rows."""
    stream_seed = int(np.random.SeedSequence([stream, seed]).generate_state(1, np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(stream_seed)
