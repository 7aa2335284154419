"""PNG figures from the per-strategy logs: error vs training time, and the time breakdown."""

from __future__ import annotations

try:
    import matplotlib
except ImportError as error:
    raise ImportError(
        "the benchmark plots need matplotlib: pip install 'hf-selective-backprop[benchmarks]' "
        "(or write the report without them: write_report(..., plots=False))"
    ) from error

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from .logs import BASELINE, CLOCKS, FACTORS, breakdown, final_error  # noqa: E402


def plot_error_vs_time(logs: dict[str, dict], path: str, clock: str = "wall", title: str = "") -> None:
    key = CLOCKS[clock]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, log in logs.items():
        xs = [0.0] + [e[key] for e in log["evals"]]
        ys = [None] + [100 * e["error"] for e in log["evals"]]
        ax.plot(
            xs[1:],
            ys[1:],
            marker="o",
            markersize=3,
            label=log.get("label", name),
            linewidth=2.2 if name == BASELINE else 1.4,
            color="black" if name == BASELINE else None,
        )
    if BASELINE in logs:
        base = final_error(logs[BASELINE])
        for f in FACTORS:
            ax.axhline(100 * f * base, color="grey", linestyle=":", linewidth=0.8)
            ax.annotate(f"{f:.1f}x", (0, 100 * f * base), fontsize=7, color="grey", va="bottom")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlabel(f"training {'wall' if clock == 'wall' else 'process CPU'} time (s, evaluation excluded)")
    ax.set_ylabel("error on the evaluation split (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_breakdown(logs: dict[str, dict], path: str, title: str = "") -> None:
    parts = ("selection_forward", "selection_overhead", "training", "data", "other")
    colors = ("tab:orange", "tab:red", "tab:blue", "tab:green", "tab:grey")
    labels = [log.get("label", name) for name, log in logs.items()]
    values = [breakdown(log) for log in logs.values()]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bottom = [0.0] * len(values)
    for part, color in zip(parts, colors, strict=True):
        heights = [v[part] for v in values]
        ax.bar(labels, heights, bottom=bottom, color=color, label=part.replace("_", " "))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("training wall time (s, evaluation excluded)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
