"""Report of the convergence-regime benchmark: tables, figures and the Pareto frontier.

    python benchmarks/paper_regime_report.py --root benchmarks/results/cifar10-paper-regime

Reads <root>/seed*/<strategy>.json and <root>/sweep/epochs*/<strategy>.json (benchmarks/run_paper_regime.sh
writes them); writes <root>/report.md and its PNGs. See docs/benchmarks/benchmarks.md.
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from harness.paper_regime import write_paper_regime_report


@dataclass
class ReportArguments:
    root: str = field(metadata={"help": "Results folder holding seed*/ and sweep/epochs*/."})
    title: str = field(
        default="CIFAR-10 near convergence: the paper's schedule, time to target error and a budget sweep",
        metadata={"help": "Report title."},
    )


if __name__ == "__main__":
    (args,) = HfArgumentParser(ReportArguments).parse_args_into_dataclasses()
    print(write_paper_regime_report(args.root, args.title))
