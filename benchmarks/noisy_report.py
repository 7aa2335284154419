"""One report over label-noise levels from the logs `benchmarks/run_noisy.sh` writes.

    python benchmarks/noisy_report.py --root benchmarks/results/cifar10-noisy --title "CIFAR-10, label noise" \
        --pairs rholoss-cdf:rholoss,stale-rholoss:rholoss

Writes <root>/report.md (strategies down, noise levels across) and <root>/accuracy_vs_noise.png.
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from harness.noise_sweep import write_sweep_report


@dataclass
class NoisyReportArguments:
    root: str = field(metadata={"help": "Folder holding noise<level>/seed<k>/ logs (RESULTS of run_noisy.sh)."})
    title: str = field(default="Label-noise sensitivity", metadata={"help": "Report title."})
    pairs: str = field(
        default="",
        metadata={"help": "Comma-separated first:second strategy pairs, e.g. rholoss-cdf:rholoss: how often, seed by "
                  "seed, the first ended more accurate than the second."},
    )


def main() -> None:
    (args,) = HfArgumentParser(NoisyReportArguments).parse_args_into_dataclasses()
    pairs = tuple(tuple(pair.split(":")) for pair in args.pairs.split(",") if pair)
    print(write_sweep_report(args.root, args.title, pairs))


if __name__ == "__main__":
    main()
