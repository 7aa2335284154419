"""The report of benchmarks/run_record.sh: pruning by the example record's scores against a random subset of the same
size, and label issues found by one run's record against cleanlab's K-fold confident learning.

    python benchmarks/record_report.py --root benchmarks/results/record-cifar10-cifar_convnet_half/epochs6

``--pool FOLDER`` adds the seeds of a replication (the same runs, other seeds, in a folder of their own) to the pruning
table; ``--output`` writes that report elsewhere than ``--root``'s ``report.md``.

Pruning: per setting (source, score, kept share) the accuracy over seeds (mean ± sd), the second run's saving against
Traditional ('full') in examples trained (the cost model) and in wall time, and end to end with the scoring run's
examples and time added. Lossless: a mean at least Traditional's mean minus its sd. Label issues: precision at the
true number of flips, the flagged set's precision and recall, AUROC, and the training each method took; then every
ranking the noisy runs' records allow (`SUSPICION`), read from the same runs, beside cleanlab's.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
from collections import Counter, defaultdict

import numpy
import pyarrow.parquet

from harness.label_metrics import auroc, precision_at_flips

SETTING = re.compile(r"(?P<source>\w+?)-(?P<score>\w+)-keep(?P<keep>[\d.]+)$")
#: The shorter runs that only score: the first N epochs ('epochN') and the proxies ('proxy', 'proxy_ARCH').
SCORING_RUN = re.compile(r"epoch\d+|proxy(_\w+)?")


def run_summary(folder: str) -> dict | None:
    """Accuracy, examples trained and train seconds of a finished scripts/train.py run (None: unfinished)."""
    state_path = os.path.join(folder, "trainer_state.json")
    if not os.path.isfile(state_path):
        return None
    with open(state_path) as handle:
        history = json.load(handle)["log_history"]
    accuracy = next((entry["eval_accuracy"] for entry in reversed(history) if "eval_accuracy" in entry), None)
    seconds = next(entry["train_runtime"] for entry in reversed(history) if "train_runtime" in entry)
    with open(os.path.join(folder, "sb_stats.json")) as handle:
        backwards = json.load(handle)["backwards"]
    return {"accuracy": None if accuracy is None else 100 * accuracy, "seconds": seconds, "backwards": backwards}


def _seeds(count: int) -> str:
    return f"{count} seed{'s' if count != 1 else ''}"


def _mean_sd(values: list[float], digits: int = 2) -> str:
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def pruning_rows(root: str, *pooled: str) -> list[str]:
    """The pruning table of the seeds under ``root`` and under each ``pooled`` folder (more seeds of the same runs,
    as a replication adds them), taken together."""
    seeds = sorted(path for folder in (root, *pooled) for path in glob.glob(os.path.join(folder, "seed*")))
    repeated = sorted(name for name, count in Counter(map(os.path.basename, seeds)).items() if count > 1)
    if repeated:
        raise ValueError(f"the same seed folders ({', '.join(repeated)}) are under more than one of {root}, "
                         f"{', '.join(pooled)}: pool folders of other seeds only")
    runs = defaultdict(dict)  # name -> seed -> summary
    for seed in seeds:
        for folder in glob.glob(os.path.join(seed, "*")):
            summary = run_summary(folder)
            if summary is not None:
                runs[os.path.basename(folder)][os.path.basename(seed)] = summary
    full = runs.get("full", {})
    if not full:
        return ["No finished Traditional ('full') run yet."]
    bar_values = [run["accuracy"] for run in full.values()]
    bar = statistics.mean(bar_values) - (statistics.stdev(bar_values) if len(bar_values) > 1 else 0.0)
    full_seconds = statistics.mean(run["seconds"] for run in full.values())
    lines = [
        f"Traditional ('full', {_seeds(len(full))}): {_mean_sd(bar_values)} % ({full_seconds:.0f} s); "
        f"lossless means at least {bar:.2f} %.{_scoring_runs(runs)}", "",
        "| setting | seeds | accuracy (%) | lossless | second run: saving, examples | second run: saving, time | "
        "end to end with its scoring run: saving, examples | end to end: saving, time | minus the random subset "
        "of the same size (points, per seed) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts, random_lossless_keeps = [], []
    for name in sorted(runs, key=_setting_order):
        if name == "full" or SCORING_RUN.fullmatch(name):
            continue
        seeds_done = runs[name]
        accuracies = [run["accuracy"] for run in seeds_done.values()]
        is_random = name.startswith("random")
        random_runs = next((runs[other] for other in runs if other.startswith("random")
                            and _setting_order(other)[0] == _setting_order(name)[0]), {})
        examples, times, end_to_end_examples, end_to_end, minus_random = [], [], [], [], []
        for seed, run in sorted(seeds_done.items()):
            if seed not in full:
                continue
            examples.append(full[seed]["backwards"] / run["backwards"])
            times.append(full[seed]["seconds"] / run["seconds"])
            # A random subset needs no scoring run: its end-to-end saving is its second run's.
            scoring = {"seconds": 0.0, "backwards": 0} if is_random else (
                runs.get(SETTING.match(name)["source"], {}).get(seed))
            if scoring is not None:
                end_to_end_examples.append(full[seed]["backwards"] / (run["backwards"] + scoring["backwards"]))
                end_to_end.append(full[seed]["seconds"] / (run["seconds"] + scoring["seconds"]))
            if not is_random and seed in random_runs:
                minus_random.append(run["accuracy"] - random_runs[seed]["accuracy"])
        lossless = _lossless(accuracies, bar)
        against_random = "n/a" if not minus_random else (
            f"{statistics.mean(minus_random):+.2f} ({', '.join(f'{value:+.2f}' for value in minus_random)})")
        lines.append(
            f"| {name} | {len(seeds_done)} | {_mean_sd(accuracies)} | {'yes' if lossless else 'no'} | "
            f"{_ratio(examples)} | {_ratio(times)} | {_ratio(end_to_end_examples, 'n/a (no scoring run)')} | "
            f"{_ratio(end_to_end, 'n/a')} | {'-' if is_random else against_random} |"
        )
        if is_random and lossless:
            random_lossless_keeps.append(f"{_setting_order(name)[0]:g}")
        if not is_random and lossless:
            random_accuracies = [run["accuracy"] for run in random_runs.values()]
            random_lossless = _lossless(random_accuracies, bar)
            verdicts.append(f"| {name} | {_ratio(examples)} | {_ratio(times)} | {_ratio(end_to_end_examples, 'n/a')} | "
                            f"{_ratio(end_to_end, 'n/a')} | "
                            f"{'yes' if random_lossless else 'no' if random_accuracies else 'not run'} |")
    lines += ["", "Lossless settings, beside the random subset of the same size:", ""]
    if verdicts:
        lines += ["| setting | second run: saving, examples | second run: saving, time | end to end: saving, "
                  "examples | end to end: saving, time | random subset of the same size lossless |",
                  "|---|---|---|---|---|---|", *verdicts]
    else:
        lines.append("None: no subset a score chose kept Traditional's accuracy" + (
            f"; the random subset did, at kept share {', '.join(random_lossless_keeps)}." if random_lossless_keeps
            else ", nor did the random subset."))
    return lines


def _scoring_runs(runs: dict) -> str:
    """The shorter scoring runs' own accuracy: a control of their cost that prunes nothing."""
    shown = [f"'{name}' ({_seeds(len(runs[name]))}) {_mean_sd([run['accuracy'] for run in runs[name].values()])} % "
             f"({statistics.mean(run['seconds'] for run in runs[name].values()):.0f} s)"
             for name in sorted(runs) if SCORING_RUN.fullmatch(name)]
    return f" Scoring runs alone: {', '.join(shown)}." if shown else ""


def _setting_order(name: str):
    match = SETTING.match(name)
    if match is None:
        keep = float(name.rsplit("keep", 1)[1]) if "keep" in name else 1.0
        return (keep, "", "")
    return (float(match["keep"]), match["source"], match["score"])


def _lossless(accuracies: list[float], bar: float) -> bool:
    return bool(accuracies) and statistics.mean(accuracies) >= bar


def _ratio(values: list[float], missing: str = "n/a") -> str:
    return f"{statistics.mean(values):.2f}x" if values else missing


def label_issue_rows(root: str) -> list[str]:
    lines = []
    for noise_folder in sorted(glob.glob(os.path.join(root, "noise*"))):
        results = [json.load(open(path)) for path in sorted(glob.glob(os.path.join(noise_folder, "seed*",
                                                                                   "cleanlab", "label_issues.json")))]
        if not results:
            continue
        lines += [f"### {os.path.basename(noise_folder)[5:]} of the labels flipped ({_seeds(len(results))})", "",
                  "| method | trainings | training time (s) | precision at the flip count | flagged | precision | "
                  "recall | AUROC |", "|---|---|---|---|---|---|---|---|"]
        for method in ("record", "cleanlab"):
            rows = [result[method] for result in results]
            precision = [r["precision_flagged"] for r in rows if r["precision_flagged"] is not None]
            lines.append(
                f"| {method} | {rows[0]['trainings']} | {statistics.mean(r['seconds'] for r in rows):.0f} | "
                f"{_mean_sd([r['precision_at_flips'] for r in rows], 3)} | "
                f"{statistics.mean(r['flagged'] for r in rows):.0f} | {_mean_sd(precision, 3)} | "
                f"{_mean_sd([r['recall_flagged'] for r in rows], 3)} | {_mean_sd([r['auroc'] for r in rows], 3)} |"
            )
        trained = defaultdict(list)
        for seed in sorted(glob.glob(os.path.join(noise_folder, "seed*"))):
            for folder in glob.glob(os.path.join(seed, "*")):
                summary = run_summary(folder)
                if summary is not None:
                    trained[os.path.basename(folder)].append(summary["accuracy"])
        lines += ["", "| training set | accuracy (%) |", "|---|---|"]
        lines += [f"| {name} | {_mean_sd(values)} |" for name, values in sorted(trained.items())]
        lines.append("")
    return lines


#: Rankings any record allows without training again (higher: likelier flipped), the `record.label_issues` orders
#: named. The first is the one label_issues.py scores as "record" (fixed before these were compared).
SUSPICION = {
    "lowest mean confidence (by='confidence')": lambda t: -t["confidence"],
    "highest mean loss (by='mean_loss')": lambda t: t["mean_loss"],
    "highest first loss (epoch 1, before its own update)": lambda t: t["first_loss"],
    "highest last loss (by='last_loss', the default)": lambda t: t["last_loss"],
    "lowest correctness": lambda t: -t["correctness"],
    "latest first learned (never: last)": lambda t: numpy.where(t["first_learned_epoch"] < 0, numpy.inf,
                                                               t["first_learned_epoch"]),
    "most forgetting events": lambda t: t["forgetting_events"].astype(float),
    "lowest area under the margin (by='aum')": lambda t: -t["aum"],
}


def record_ranking_rows(root: str, id_column: str = "index") -> list[str]:
    """Per noise level, every `SUSPICION` ranking of each noisy run's record beside cleanlab's, per seed."""
    lines = []
    for noise_folder in sorted(glob.glob(os.path.join(root, "noise*"))):
        results = sorted(glob.glob(os.path.join(noise_folder, "seed*", "cleanlab", "label_issues.json")))
        if not results:
            continue
        measured = defaultdict(lambda: ([], []))  # ranking -> (precisions, AUROCs), one per seed
        for path in results:
            run = os.path.join(os.path.dirname(os.path.dirname(path)), "full")
            columns = pyarrow.parquet.read_table(os.path.join(run, "example_record.parquet")).to_pydict()
            table = {name: numpy.asarray(values) for name, values in columns.items()}
            flipped = numpy.isin(table[id_column],
                                 numpy.fromfile(os.path.join(run, "noisy_indices.int64"), dtype=numpy.int64))
            for name, suspicion_of in SUSPICION.items():
                try:
                    values = suspicion_of(table)
                except KeyError:  # a column of a later version than the record (aum)
                    continue
                suspicion = numpy.nan_to_num(numpy.asarray(values, dtype=float), nan=-numpy.inf)
                measured[name][0].append(precision_at_flips(suspicion, flipped))
                measured[name][1].append(auroc(suspicion, flipped))
            with open(path) as handle:
                cleanlab = json.load(handle)["cleanlab"]
            folds = cleanlab["trainings"]
            measured[f"cleanlab {folds}-fold ({folds} trainings)"][0].append(cleanlab["precision_at_flips"])
            measured[f"cleanlab {folds}-fold ({folds} trainings)"][1].append(cleanlab["auroc"])
        lines += [f"### {os.path.basename(noise_folder)[5:]} of the labels flipped: every ranking of the record "
                  f"({_seeds(len(results))}; per seed in brackets)", "",
                  "| ranking | precision at the flip count | AUROC |", "|---|---|---|"]
        for name, (precisions, aurocs) in measured.items():
            lines.append(f"| {name} | {_mean_sd(precisions, 3)} ({'; '.join(f'{p:.3f}' for p in precisions)}) | "
                         f"{_mean_sd(aurocs, 3)} ({'; '.join(f'{a:.3f}' for a in aurocs)}) |")
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--pool", nargs="+", default=[],
                        help="Folders of more seeds of the same pruning runs (a replication), pooled with --root's")
    parser.add_argument("--output", help="Where the report goes (default: --root's report.md)")
    options = parser.parse_args()
    where = " and ".join(f"`{folder}`" for folder in (options.root, *options.pool))
    report = ["# The example record: pruning for the next run, and label issues", "",
              f"Runs under {where} (benchmarks/run_record.sh).", "", "## Pruning", "",
              *pruning_rows(options.root, *options.pool), "", "## Label issues", "",
              *(label_issue_rows(options.root) or ["None run here (no noise* folder)."]),
              *record_ranking_rows(options.root)]
    path = options.output or os.path.join(options.root, "report.md")
    with open(path, "w") as handle:
        handle.write("\n".join(report) + "\n")
    print("\n".join(report))


if __name__ == "__main__":
    main()
