import os

import pytest
import torch

# Two cores: one intra-op thread per test process keeps timings and results stable.
torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def output_dir(tmp_path):
    return str(tmp_path / "out")
