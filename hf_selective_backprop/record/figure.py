"""The data map (Swayamdipta et al., 2020): each example's confidence against its variability, coloured by
correctness, with the regions named. Needs matplotlib (the ``benchmarks`` extra, or ``pip install matplotlib``)."""

from __future__ import annotations

import io
import os

import matplotlib

matplotlib.use("Agg")  # files only: training machines rarely have a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy  # noqa: E402
from PIL import Image  # noqa: E402  (a dependency of matplotlib)

from ..engine.checkpoints import written_in_place_of  # noqa: E402
from .scores import AMBIGUOUS, EASY, HARD  # noqa: E402

#: How far from chance (1/K of the scorings right) towards all of them a model's mean correctness must get before
#: the figure stops saying it barely learned: a classifier near chance still puts every example in a region. A
#: quarter of the way: 0.625 of the scorings right for 2 classes, 0.325 for 10.
BARELY_LEARNED = 0.25
#: Points drawn at most: beyond it a random sample (seeded) shows the same picture, faster and lighter.
MAX_POINTS = 50_000


def barely_learned(correctness: float, classes: int | None) -> bool:
    """Whether a mean ``correctness`` sits near chance for a classifier of ``classes`` classes (never, unknown)."""
    if classes is None or classes < 2:
        return False
    chance = 1.0 / classes
    return correctness < chance + BARELY_LEARNED * (1.0 - chance)


def draw_data_map(table, path: str, title: str | None = None, classes: int | None = None) -> dict[str, int]:
    """Draw ``table`` (a record: `load_record` or the trainer's ``example_record.parquet``) into ``path``; returns
    the examples in each region, as the figure names them. ``classes``: how many the model told apart, which says
    what chance is (a note on the figure says when the model barely left it)."""
    confidence = numpy.asarray(table["confidence"], dtype=float)
    variability = numpy.asarray(table["variability"], dtype=float)
    correctness = numpy.asarray(table["correctness"], dtype=float)
    region = numpy.asarray([name or "" for name in table["region"]])
    known = ~numpy.isnan(confidence)
    shown = numpy.flatnonzero(known)
    if shown.size > MAX_POINTS:
        shown = numpy.sort(numpy.random.default_rng(0).choice(shown, MAX_POINTS, replace=False))
    figure, axes = plt.subplots(figsize=(7, 6))
    points = axes.scatter(variability[shown], confidence[shown], c=correctness[shown], cmap="viridis", vmin=0,
                          vmax=1, s=4, alpha=0.6, linewidths=0)
    figure.colorbar(points, ax=axes, label="correctness (share of scorings learned)")
    # The cuts the regions are counted by: confidence 1/2, and the variability from which the most variable third
    # is ambiguous (scores.regions).
    axes.axhline(0.5, color="grey", linewidth=0.8, linestyle="--")
    ambiguous = known & (region == AMBIGUOUS)
    if ambiguous.any():
        axes.axvline(float(variability[ambiguous].min()), color="grey", linewidth=0.8, linestyle=":")
    counts = {name: int((region[known] == name).sum()) for name in (EASY, AMBIGUOUS, HARD)}
    total = max(int(known.sum()), 1)
    learned = float(numpy.nanmean(correctness[known])) if known.any() else float("nan")
    if barely_learned(learned, classes):
        axes.text(0.5, 0.85, f"the model barely learned: {100 * learned:.0f} % of scorings right, chance "
                  f"{100 / classes:.0f} %;\nthe regions say little about the examples", transform=axes.transAxes,
                  ha="center", va="center", fontsize=11,
                  color="darkred", bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "darkred"})
    places = {EASY: (0.02, 0.96, "top"), HARD: (0.02, 0.04, "bottom"), AMBIGUOUS: (0.98, 0.5, "center")}
    for name, (x, y, vertical) in places.items():
        axes.text(x, y, f"{name}: {counts[name]:,} ({100 * counts[name] / total:.0f} %)", transform=axes.transAxes,
                  ha="right" if x > 0.5 else "left", va=vertical, fontsize=10,
                  bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
    axes.set_xlabel("variability (std of p(gold) over scorings)")
    axes.set_ylabel("confidence (mean p(gold) over scorings)")
    axes.set_ylim(-0.02, 1.02)
    axes.set_title(title or f"Data map of {total:,} training examples")
    figure.tight_layout()
    extension = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    with written_in_place_of(path) as partial_path:
        if extension == "png":
            _save_palette_png(figure, partial_path)
        else:  # another format matplotlib writes, by the path's extension
            figure.savefig(partial_path, dpi=110, format=extension)
    plt.close(figure)
    return counts


def _save_palette_png(figure, path: str) -> None:
    # Thousands of translucent points make a true-colour PNG of ~300 KB; 256 colours draw the same at a third of it,
    # which counts for a figure uploaded beside every model.
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    buffer.seek(0)
    with Image.open(buffer) as image:
        palette = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    palette.save(path, format="PNG", optimize=True)
