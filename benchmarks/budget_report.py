"""Report of the budget study: final accuracy of every strategy at each --sb_budget, the winner per budget, and
final error against budget with its Pareto frontier.

    python benchmarks/budget_report.py --root benchmarks/results/budget-finetune-cifar10

Reads <root>/budget<F>/seed*/<strategy>.json (benchmarks/run_budget.sh writes them); writes <root>/report.md and
error_vs_budget.png. See docs/benchmarks/benchmarks.md.
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from harness.budget_report import write_budget_report


@dataclass
class ReportArguments:
    root: str = field(metadata={"help": "Results folder holding budget<F>/seed*/."})
    title: str = field(default="Every strategy at a compute budget (--sb_budget)", metadata={"help": "Report title."})


if __name__ == "__main__":
    (args,) = HfArgumentParser(ReportArguments).parse_args_into_dataclasses()
    print(write_budget_report(args.root, args.title))
