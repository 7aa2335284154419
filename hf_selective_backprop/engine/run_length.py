"""How long a selective run is: expected optimizer steps, and bounds the Trainer's loop needs."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from transformers.trainer_utils import has_length


@dataclass(frozen=True)
class RunLength:
    """Sizes of a run in which an epoch is one pass of the data through selection.

    ``rows_per_epoch`` are the examples one process reads per epoch; a step trains
    ``rows_per_step`` = batch size x gradient accumulation of them.
    """

    rows_per_epoch: int
    selection_batches_per_epoch: int
    selection_batch_size: int
    rows_per_step: int
    keep: float
    active_share: float
    warmup_epochs: int

    @classmethod
    def for_run(cls, args, keep: float, dataloader, num_examples: int, num_processes: int, batch_size: int,
                selection_batch_size: int) -> RunLength:
        """The plan of a run over ``dataloader`` (selection batches per process).

        A stream (no length) is step-based: the Trainer demands max_steps, and an epoch is one pass of
        the stream, of unknown length.
        """
        rows_per_step = batch_size * args.gradient_accumulation_steps
        if not has_length(dataloader):
            return cls(0, sys.maxsize, selection_batch_size, rows_per_step, keep, 1.0, args.sb_warmup_epochs)
        if not len(dataloader):
            raise ValueError("the training dataset is empty")
        active = (args.sb_end - args.sb_start) * (1.0 - 1.0 / args.sb_interrupt if args.sb_interrupt else 1.0)
        rows_per_epoch = min(len(dataloader) * selection_batch_size, math.ceil(num_examples / num_processes))
        plan = cls(rows_per_epoch, len(dataloader), selection_batch_size, rows_per_step, keep, active,
                   args.sb_warmup_epochs)
        kept_per_epoch = rows_per_epoch * plan.expected_keep()
        if kept_per_epoch < rows_per_step:
            # kath18 keeps 1/presample of what it reads: with --sb_presample given, that is the flag to change.
            keep_flag = "a larger --sb_keep"
            if args.sb_strategy == "kath18" and args.sb_presample is not None:
                keep_flag = "a smaller --sb_presample"
            raise ValueError(
                f"an epoch of {rows_per_epoch} examples per process keeps about {kept_per_epoch:.0f}, fewer than "
                f"one optimizer step needs ({batch_size} x {args.gradient_accumulation_steps} gradient "
                f"accumulation): use a larger dataset, a smaller --per_device_train_batch_size or {keep_flag}"
            )
        if len(dataloader) == 1 and args.max_steps <= 0 and rows_per_epoch > rows_per_step:
            # The run ends when its data is read: the last epoch's one batch would make a single step and
            # leave the rest of what it kept untrained.
            flag = f"--sb_selection_batch_size {selection_batch_size}"
            if args.sb_strategy == "kath18" and args.sb_selection_batch_size is None:
                flag = f"--sb_presample {args.sb_presample_value:g} (a selection batch of {selection_batch_size})"
            raise ValueError(
                f"{flag} reads a whole epoch ({rows_per_epoch} examples per process) in one selection batch, and an "
                "epoch-based run ends when its data is read, so most rows the last one keeps would never be "
                f"trained: use --sb_selection_batch_size of at most {max(rows_per_epoch // 2, 1)}, or --max_steps"
            )
        return plan

    def expected_keep(self) -> float:
        """Average share of read rows that is trained, over the steps after warm-up."""
        active, keep = self.active_share, self.keep
        # A step with selection reads rows_per_step / keep rows, one without reads rows_per_step.
        return 1.0 / (1.0 - active + active / keep)

    def expected_steps(self, epochs: float) -> int:
        warm = min(epochs, self.warmup_epochs)
        rows = warm * self.rows_per_epoch + (epochs - warm) * self.rows_per_epoch * self.expected_keep()
        return max(1, math.floor(rows / self.rows_per_step))

    def loop_values(self, values, args, epoch_based: bool):
        """The Trainer's loop values (``_compat.TrainingValues``) for this plan: an epoch-based run's expected
        steps, a step-based run's unbounded epochs, and a bound on one epoch's micro-batches."""
        epochs, max_steps = values.num_train_epochs, values.max_steps
        if epoch_based:
            max_steps = self.expected_steps(args.num_train_epochs)
        else:
            epochs = sys.maxsize  # a step-based run reads as many epochs as its steps need
        micro_batches = self.max_micro_batches_per_epoch(args.gradient_accumulation_steps)
        steps = micro_batches // args.gradient_accumulation_steps
        return values._replace(num_train_epochs=epochs, num_update_steps_per_epoch=steps, steps_in_epoch=micro_batches,
                               max_steps=max_steps)

    def max_micro_batches_per_epoch(self, grad_accum: int) -> int:
        """A bound on the micro-batches of one epoch (a multiple of grad_accum).

        Every read row is trained at most once, plus a queue carried from the previous epoch.
        """
        rows = self.selection_batches_per_epoch * self.selection_batch_size + self.rows_per_step
        steps = math.ceil(rows / self.rows_per_step)
        return steps * grad_accum
