"""Subprocess body of the SIGKILL resume test (tests/test_resume.py).

    python tests/resume_worker.py OUTPUT_DIR fresh [--step-sleep SECONDS]
    python tests/resume_worker.py OUTPUT_DIR resume [--wait-stdin]

``fresh`` trains from scratch with a checkpoint after every optimizer step; ``--step-sleep`` slows
each step down (it changes no number) so the test can kill the run part-way. ``resume`` continues
from the last complete checkpoint of OUTPUT_DIR (``resume_from_checkpoint=True``). Both write
OUTPUT_DIR/final.pt: the weights and the selection state at the end. ``--wait-stdin`` imports
everything, then waits for a line on stdin before training (the test starts the resuming process
early, so its imports overlap the killed run).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from tiny import TinyConv, make_config, make_image_dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from hf_selective_backprop import SelectiveBackpropTrainer  # noqa: E402

# Stale-SB (a scoring epoch, then stale ones) with a selection batch that differs from the
# training batch and gradient accumulation, on augmented images (the augmentation generator is
# part of the saved state): a kill can land anywhere in the state machine.
SETTINGS = dict(
    sb_strategy="sb",
    sb_beta=1.0,
    sb_staleness=3,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    sb_selection_batch_size=6,
    num_train_epochs=4,
    save_strategy="steps",
    save_steps=1,
)
DATASET_SIZE = 96


class _Sleep(TrainerCallback):
    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def final_state(trainer: SelectiveBackpropTrainer) -> dict:
    return {
        "weights": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
        "global_step": trainer.state.global_step,
        "history": trainer.selector.state_dict(),
        "store": trainer.engine.store.state_dict(),
        "queue": trainer.engine.queue.state_dict(),
        "generator": trainer.engine.generator.get_state(),
        "augmentation": trainer.train_dataset.transform.generator.get_state(),
        "stats": trainer.sb_stats,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("mode", choices=["fresh", "resume"])
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--wait-stdin", action="store_true")
    options = parser.parse_args()
    if options.wait_stdin and sys.stdin.readline().strip() != "go":
        return
    torch.set_num_threads(1)
    trainer = SelectiveBackpropTrainer(
        model=TinyConv(),
        args=make_config(options.output_dir, **SETTINGS),
        train_dataset=make_image_dataset(DATASET_SIZE),
    )
    if options.step_sleep:
        trainer.add_callback(_Sleep(options.step_sleep))
    trainer.train(resume_from_checkpoint=True if options.mode == "resume" else None)
    torch.save(final_state(trainer), os.path.join(options.output_dir, "final.pt"))


if __name__ == "__main__":
    main()
