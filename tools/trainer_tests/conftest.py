"""transformers' own Trainer tests with `SelectiveBackpropTrainer` in the Trainer's place (tools/trainer_tests/run.sh).

Before the test modules import, `transformers.Trainer` becomes a `SelectiveBackpropTrainer` and
`transformers.TrainingArguments` a `SelectiveBackpropConfig`: SB_SWAP_MODE=none with ``sb_strategy="none"`` (a
trainer given no arguments builds those too), SB_SWAP_MODE=default as the config comes (the default strategy).
"""

import dataclasses
import os

import transformers
import transformers.trainer
import transformers.training_args

REAL_TRAINER = transformers.Trainer

# Imported before the swap, so that the package's classes are built on transformers' own.
from hf_selective_backprop import _compat  # noqa: E402
from hf_selective_backprop.config import SelectiveBackpropConfig  # noqa: E402
from hf_selective_backprop.trainer import SelectiveBackpropTrainer  # noqa: E402

MODE = os.environ.get("SB_SWAP_MODE", "none")
if MODE not in ("none", "default"):
    raise RuntimeError(f"SB_SWAP_MODE must be 'none' or 'default', got {MODE!r}")

if MODE == "none":

    @dataclasses.dataclass
    class SwappedArguments(SelectiveBackpropConfig):
        sb_strategy: str = "none"

    class SwappedTrainer(SelectiveBackpropTrainer):
        def default_arguments(self, model):
            return SwappedArguments(output_dir="tmp_trainer")

else:
    SwappedArguments = SelectiveBackpropConfig

    class SwappedTrainer(SelectiveBackpropTrainer):
        pass


# The loss-scale check reads `transformers.Trainer.compute_loss` when it runs: after the swap that name is the
# swapped trainer, which no user's program has; it is pointed at the Trainer's own.
object.__setattr__(_compat.TRAINER_LOSS_SCALE, "upstream", lambda: REAL_TRAINER.compute_loss)

transformers.Trainer = transformers.trainer.Trainer = SwappedTrainer
transformers.TrainingArguments = transformers.training_args.TrainingArguments = SwappedArguments
