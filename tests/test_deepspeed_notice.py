"""DeepSpeed's "Setting accelerator to CPU" line only where DeepSpeed trains (`deepspeed_notice`).

Each case runs in a fresh interpreter: DeepSpeed logs the line once, when it is first imported."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed", reason="the line comes from an installed DeepSpeed: pip install '.[deepspeed]'")
if torch.cuda.is_available():
    pytest.skip("DeepSpeed finds an accelerator here and logs no such line", allow_module_level=True)

TESTS = Path(__file__).parent
NOTICE = "Setting accelerator to CPU"


def run_python(code: str, **env) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=TESTS,
                            env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


BUILD_A_TRAINER = """
import sys
from datasets import Dataset
from text_tiny import sequence_classifier
from tiny import make_config
from hf_selective_backprop import SelectiveBackpropTrainer
rows = Dataset.from_dict({"input_ids": [[1, 2, 3]] * 8, "attention_mask": [[1, 1, 1]] * 8, "labels": [0, 1] * 4})
SelectiveBackpropTrainer(model=sequence_classifier(), args=make_config(sys.argv[0]), train_dataset=rows)
print("deepspeed imported:", "deepspeed" in sys.modules)
"""


def test_a_trainer_that_does_not_use_deepspeed_prints_no_deepspeed_accelerator_line(tmp_path):
    output = run_python(BUILD_A_TRAINER.replace("sys.argv[0]", repr(str(tmp_path))))
    assert "deepspeed imported: True" in output  # accelerate imported it while the trainer was built
    assert NOTICE not in output


def test_the_line_stays_where_deepspeed_trains():
    """With a DeepSpeed config, or under `accelerate launch --use_deepspeed`, DeepSpeed's own word is kept."""
    code = ("from types import SimpleNamespace\n"
            "from hf_selective_backprop.deepspeed_notice import quiet_unless_deepspeed\n"
            "with quiet_unless_deepspeed(SimpleNamespace(deepspeed={ds})):\n"
            "    import deepspeed\n")
    assert NOTICE in run_python(code.format(ds="'ds_config.json'"))
    assert NOTICE in run_python(code.format(ds=None), ACCELERATE_USE_DEEPSPEED="true")
    assert NOTICE not in run_python(code.format(ds=None))
