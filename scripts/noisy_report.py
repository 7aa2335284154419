"""One report over label-noise levels from the logs `benchmarks/run_noisy.sh` writes.

    python scripts/noisy_report.py --root benchmarks/results/cifar10-noisy --title "CIFAR-10, label noise"

Writes <root>/report.md (strategies down, noise levels across) and <root>/accuracy_vs_noise.png.
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from hf_selective_backprop.benchmarks.noise_sweep import write_sweep_report


@dataclass
class NoisyReportArguments:
    root: str = field(metadata={"help": "Folder holding noise<level>/seed<k>/ logs (RESULTS of run_noisy.sh)."})
    title: str = field(default="Label-noise sensitivity", metadata={"help": "Report title."})


def main() -> None:
    (args,) = HfArgumentParser(NoisyReportArguments).parse_args_into_dataclasses()
    print(write_sweep_report(args.root, args.title))


if __name__ == "__main__":
    main()
