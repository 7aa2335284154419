"""One process of a two-process SelectiveBackpropSFTTrainer run (Stale-SB, completion-only loss).

Launched by ``tests/test_sft.py`` through torchrun; writes ``rank{rank}.pt`` into the folder given. With
``--packing``, the rows are packed (TRL's ``packing=True``): each rank splits its packed rows into sequences,
so the ranks score and keep different numbers of sequences per batch.
"""

from __future__ import annotations

import os
import sys

import torch
from sft_data import prompt_completion, sft_model, sft_tokenizer  # beside this file: the script's sys.path[0]
from worker_exit import exit_after_results

from hf_selective_backprop import SelectiveBackpropSFTConfig, SelectiveBackpropSFTTrainer


def main(out: str, packed: bool) -> None:
    tokenizer = sft_tokenizer()
    settings = dict(sb_strategy="sb", per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=3,
                    learning_rate=1e-2, sb_staleness=2, report_to=[], use_cpu=True, bf16=False, save_strategy="no",
                    disable_tqdm=True, seed=0, max_length=32)
    examples = 64
    if packed:  # a packed row holds about 3.5 of these sequences: more of them, for a few steps per epoch
        settings.update(packing=True, per_device_train_batch_size=2, dataset_num_proc=None)
        examples = 192
    args = SelectiveBackpropSFTConfig(os.path.join(out, "trainer"), **settings)
    trainer = SelectiveBackpropSFTTrainer(model=sft_model(tokenizer), args=args,
                                          train_dataset=prompt_completion(examples), processing_class=tokenizer)
    trainer.train()
    weights = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    result = {"global_step": trainer.state.global_step, "weights": weights, **trainer.sb_stats}
    torch.save(result, os.path.join(out, f"rank{trainer.args.process_index}.pt"))
    exit_after_results()


if __name__ == "__main__":
    main(sys.argv[1], "--packing" in sys.argv[2:])
