"""The lossless frontier (`benchmarks/run_frontier.sh`): accuracy against measured wall-clock saving, one curve per
strategy family and one for the uniform random subset, and the largest saving each keeps Traditional's accuracy at.

Layout of its results folder: ``seed<k>/<setting>.json``, where a setting is a strategy name with its knobs
(``infobatch-r0.3``, ``stale-sb-n2-keep0.5``) and ``uniform-for-<setting>`` its random-subset control at the
backward fraction it realised. Every saving is read against the Traditional run of the same seed.

*Lossless* means a mean accuracy over seeds at least Traditional's mean minus one standard deviation. Only settings
run in every seed Traditional ran in can be lossless: a setting seen in fewer seeds is shown, not ranked.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

from .logs import BASELINE, CLOCKS, final_error
from .seeds import load_seeds, provenance_summary
from .strategies import _trailing_knob

CONTROL_PREFIX = "uniform-for-"
UNIFORM = "uniform"


def family(name: str) -> str:
    """The strategy a setting belongs to, its knobs removed (``stale-sb-n2-keep0.5`` -> ``stale-sb``); every
    uniform control belongs to ``uniform``."""
    if name.startswith(CONTROL_PREFIX) or name == UNIFORM:
        return UNIFORM
    while (trailing := _trailing_knob(name)) is not None:
        name = trailing[0]
    return name


def _accuracy(log: dict) -> float:
    return 100 * (1 - final_error(log))


def _backward_fraction(log: dict) -> float:
    stats = log["stats"]
    return stats["backwards"] / stats["examples_seen"]


def _unit_costs(logs: dict[str, dict]) -> tuple[float, float]:
    """Seconds per backward pass (Traditional's training time over its backward passes, so data and optimizer
    time are in it) and per selection forward (the mean of this seed's runs that made any), in one seed."""
    base = logs[BASELINE]
    backward = base[CLOCKS["wall"]] / base["stats"]["backwards"]
    forwards = [
        log["stats"]["selection_forward_seconds"] / log["stats"]["selection_forwards"]
        for log in logs.values()
        if log["stats"].get("selection_forwards")
    ]
    return backward, statistics.fmean(forwards) if forwards else 0.0


def _model_seconds(log: dict, units: tuple[float, float]) -> float:
    stats = log["stats"]
    return stats["backwards"] * units[0] + stats.get("selection_forwards", 0) * units[1]


@dataclass
class Setting:
    """One setting over the seeds it ran in; every list has one entry per seed, in ``seeds``' order."""

    name: str
    label: str
    family: str
    seeds: list[str] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)  # %
    saving: list[float] = field(default_factory=list)  # Traditional's wall-clock training time over this run's
    model_saving: list[float] = field(default_factory=list)  # the same, from the cost model
    backward_fraction: list[float] = field(default_factory=list)
    margin: list[float | None] = field(default_factory=list)  # accuracy minus its uniform control's (points)

    def mean(self, values: str) -> float:
        return statistics.fmean(getattr(self, values))

    def sd(self, values: str) -> float:
        entries = getattr(self, values)
        return statistics.stdev(entries) if len(entries) > 1 else 0.0


def collect(seeds: dict[str, dict[str, dict]]) -> list[Setting]:
    """Every setting but Traditional, in the order the logs name them, from seeds that have a Traditional run."""
    settings: dict[str, Setting] = {}
    for seed, logs in seeds.items():
        base = logs.get(BASELINE)
        if base is None:
            continue
        units = _unit_costs(logs)
        for name, log in logs.items():
            if name == BASELINE:
                continue
            setting = settings.setdefault(name, Setting(name, log.get("label", name), family(name)))
            control = logs.get(CONTROL_PREFIX + name)
            setting.seeds.append(seed)
            setting.accuracy.append(_accuracy(log))
            setting.saving.append(base[CLOCKS["wall"]] / log[CLOCKS["wall"]])
            setting.model_saving.append(_model_seconds(base, units) / _model_seconds(log, units))
            setting.backward_fraction.append(_backward_fraction(log))
            setting.margin.append(None if control is None else _accuracy(log) - _accuracy(control))
    return list(settings.values())


@dataclass(frozen=True)
class Baseline:
    """Traditional over the seeds: its accuracy's mean and standard deviation, and the floor a lossless setting's
    mean accuracy must reach (mean minus one standard deviation)."""

    seeds: tuple[str, ...]
    mean: float
    sd: float

    @property
    def floor(self) -> float:
        return self.mean - self.sd


def baseline(seeds: dict[str, dict[str, dict]]) -> Baseline:
    runs = {seed: logs[BASELINE] for seed, logs in seeds.items() if BASELINE in logs}
    if not runs:
        raise ValueError("no Traditional run (traditional.json) in any seed folder: nothing to measure savings against")
    accuracies = [_accuracy(log) for log in runs.values()]
    return Baseline(tuple(runs), statistics.fmean(accuracies),
                    statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0)


def ranked(setting: Setting, base: Baseline) -> bool:
    """Whether a setting ran in every seed Traditional ran in (only those can be called lossless)."""
    return set(base.seeds) <= set(setting.seeds)


def lossless(setting: Setting, base: Baseline) -> bool:
    return ranked(setting, base) and setting.mean("accuracy") >= base.floor


def largest_lossless(settings: list[Setting], base: Baseline) -> dict[str, Setting | None]:
    """Per family (in first-seen order, the uniform subset last): its lossless setting with the largest mean
    wall-clock saving, or None when it has none."""
    families = list(dict.fromkeys(s.family for s in settings if s.family != UNIFORM))
    if any(s.family == UNIFORM for s in settings):
        families.append(UNIFORM)
    best = {}
    for name in families:
        candidates = [s for s in settings if s.family == name and lossless(s, base)]
        best[name] = max(candidates, key=lambda s: s.mean("saving"), default=None)
    return best


def uniform_at(seeds: dict[str, dict[str, dict]], seed: str, saving: float) -> float | None:
    """The uniform random subset's accuracy at this wall-clock saving in this seed: linear between the seed's
    uniform runs, with Traditional as the subset of every example (saving 1); None outside what they span."""
    logs = seeds[seed]
    base = logs[BASELINE]
    points = sorted(
        [(1.0, _accuracy(base))]
        + [(base[CLOCKS["wall"]] / log[CLOCKS["wall"]], _accuracy(log))
           for name, log in logs.items() if family(name) == UNIFORM]
    )
    for (left_x, left_y), (right_x, right_y) in zip(points, points[1:], strict=False):
        if left_x <= saving <= right_x:
            share = 0.0 if right_x == left_x else (saving - left_x) / (right_x - left_x)
            return left_y + share * (right_y - left_y)
    return None


def against_uniform_curve(setting: Setting, seeds: dict[str, dict[str, dict]]) -> list[float | None]:
    """Per seed: the setting's accuracy minus the uniform curve's at the same measured wall-clock saving (a random
    subset of equal cost, selection forward included, where a matched control has equal backward passes)."""
    gaps = []
    for seed, accuracy, saving in zip(setting.seeds, setting.accuracy, setting.saving, strict=True):
        curve = uniform_at(seeds, seed, saving)
        gaps.append(None if curve is None else accuracy - curve)
    return gaps


def _spread(values: list[float], digits: int = 2, suffix: str = "") -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} ± {sd:.{digits}f}{suffix}"


def _per_seed(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    listed = ", ".join("-" if v is None else f"{v:+.2f}" for v in values)
    return f"{statistics.fmean(known):+.2f} ({listed})"


def _row(setting: Setting, seeds: dict[str, dict[str, dict]], base: Baseline) -> list[str]:
    verdict = "yes" if lossless(setting, base) else ("no" if ranked(setting, base) else "-")
    return [
        setting.label,
        str(len(setting.seeds)),
        _spread(setting.accuracy),
        verdict,
        _spread(setting.saving, 2, "x"),
        _spread(setting.model_saving, 2, "x"),
        f"{setting.mean('backward_fraction'):.2f}",
        "-" if setting.family == UNIFORM else _per_seed(setting.margin),
        "-" if setting.family == UNIFORM else _per_seed(against_uniform_curve(setting, seeds)),
    ]


_HEAD = (
    "| {first} | seeds | accuracy (%) | lossless | wall-clock saving | cost-model saving | backward fraction | "
    "minus its uniform control (points) | minus the uniform curve at equal saving (points) |"
)


def largest_table(settings: list[Setting], seeds: dict[str, dict[str, dict]], base: Baseline) -> str:
    lines = [_HEAD.format(first="strategy: its largest lossless saving"), "|" + "---|" * 9]
    for name, best in largest_lossless(settings, base).items():
        if best is None:
            ranked_ones = [s for s in settings if s.family == name and ranked(s, base)]
            closest = max(ranked_ones, key=lambda s: s.mean("accuracy"), default=None)
            note = "" if closest is None else f"; most accurate: {closest.label}, {_spread(closest.accuracy)} %"
            lines.append(f"| {name}: none{note} |" + " |" * 8)
            continue
        lines.append("| " + " | ".join(_row(best, seeds, base)) + " |")
    return "\n".join(lines)


def settings_table(settings: list[Setting], seeds: dict[str, dict[str, dict]], base: Baseline) -> str:
    lines = [_HEAD.format(first="setting"), "|" + "---|" * 9]
    for setting in sorted(settings, key=lambda s: (s.family == UNIFORM, s.family, -s.mean("saving"))):
        lines.append("| " + " | ".join(_row(setting, seeds, base)) + " |")
    return "\n".join(lines)


def target_table(settings: list[Setting], base: Baseline, target: float) -> str:
    """Whether a strategy's largest lossless saving reaches ``target`` and exceeds the uniform subset's."""
    best = largest_lossless(settings, base)
    uniform = best.pop(UNIFORM, None)
    uniform_saving = uniform.mean("saving") if uniform else 1.0
    lines = [
        f"| strategy | largest lossless saving | >= {target:g}x | > the uniform subset's ({uniform_saving:.2f}x) "
        "| both |",
        "|---|---|---|---|---|",
    ]
    for name, setting in best.items():
        saving = setting.mean("saving") if setting else 1.0
        reaches, beats = saving >= target, saving > uniform_saving
        lines.append(
            f"| {name} | {saving:.2f}x{'' if setting else ' (none lossless)'} | {'yes' if reaches else 'no'} | "
            f"{'yes' if beats else 'no'} | {'**met**' if reaches and beats else 'no'} |"
        )
    return "\n".join(lines)


def plot_frontier(settings: list[Setting], base: Baseline, path: str) -> str:
    """Accuracy against wall-clock saving: a line per family through its settings' means (error bars: sd over
    seeds; hollow: run in fewer seeds than Traditional), the uniform subset in black, Traditional's spread grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 6))
    axis.axhspan(base.mean - base.sd, base.mean + base.sd, color="grey", alpha=0.25,
                 label=f"Traditional, mean ± sd ({len(base.seeds)} seed(s))")
    axis.axhline(base.mean, color="grey", linewidth=0.8)
    families = list(dict.fromkeys(s.family for s in settings))
    for index, name in enumerate(sorted(families, key=lambda f: f == UNIFORM)):
        members = sorted((s for s in settings if s.family == name), key=lambda s: s.mean("saving"))
        colour = "black" if name == UNIFORM else f"C{index % 10}"
        style = "--" if name == UNIFORM else "-"
        xs, ys = [s.mean("saving") for s in members], [s.mean("accuracy") for s in members]
        axis.plot(xs, ys, style, color=colour, alpha=0.8, label=name)
        for setting, x, y in zip(members, xs, ys, strict=True):
            full = ranked(setting, base)
            axis.errorbar(x, y, yerr=setting.sd("accuracy"), fmt="o", color=colour, capsize=2,
                          markerfacecolor=colour if full else "white")
            if name != UNIFORM:
                axis.annotate(setting.name.removeprefix(name).lstrip("-") or name, (x, y), fontsize=6,
                              xytext=(3, 3), textcoords="offset points")
    axis.set_xlabel("wall-clock saving: Traditional's training time over the run's (x)")
    axis.set_ylabel("final test accuracy (%)")
    axis.set_title("Accuracy against measured saving; grey band: Traditional's spread; hollow: fewer seeds")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def write_frontier_report(root: str, title: str, target: float) -> str:
    seeds = load_seeds(root)
    if not seeds:
        raise ValueError(f"no seed*/ folders with logs in {root}")
    base = baseline(seeds)
    settings = collect(seeds)
    plot_frontier(settings, base, os.path.join(root, "frontier.png"))
    traditional_seconds = [seeds[seed][BASELINE][CLOCKS["wall"]] for seed in base.seeds]
    parts = [
        f"# {title}\n",
        f"Traditional: {base.mean:.2f} ± {base.sd:.2f} % over {len(base.seeds)} seed(s), "
        f"{_spread(traditional_seconds, 0)} s of training. **Lossless**: a mean accuracy of at least "
        f"{base.floor:.2f} % (Traditional's mean minus one standard deviation), in every seed Traditional ran in.\n",
        "## Each strategy's largest lossless saving\n",
        largest_table(settings, seeds, base),
        "\nThe uniform row is the random subset's own: a subset that stays within Traditional's spread is a saving "
        "too, with no selection forward, and it is the one to beat.\n",
        f"## Does a strategy save at least {target:g}x losslessly, and more than the random subset?\n",
        target_table(settings, base, target),
        "",
        "![frontier](frontier.png)\n",
        "## Every setting\n",
        settings_table(settings, seeds, base),
        "\nMean ± standard deviation over seeds; per-seed values in brackets. Wall-clock saving: the same seed's "
        "Traditional training time over the run's (evaluation excluded). Cost-model saving: the same from backward "
        "passes x Traditional's seconds per backward pass + selection forwards x the seed's measured seconds per "
        "selection forward. Lossless '-': run in fewer seeds than Traditional. Its uniform control trains as many "
        "examples (the same backward fraction); the uniform curve at equal saving is a random subset that costs as "
        "much wall-clock time, selection forward included (linear between the seed's uniform runs, Traditional at "
        "1x; '-' beyond the largest uniform saving measured).\n",
        f"{provenance_summary(seeds)} Each run's command is in its log.\n",
    ]
    path = os.path.join(root, "report.md")
    with open(path, "w") as handle:
        handle.write("\n".join(parts))
    return path
