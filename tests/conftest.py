import os

import pytest
import torch
from text_tiny import write_review_folder

# Two cores: one intra-op thread per test process keeps timings and results stable.
torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def output_dir(tmp_path):
    return str(tmp_path / "out")


@pytest.fixture
def review_folder(tmp_path):
    """A local dataset in the Hub layout: a 'review' column and string labels."""
    return write_review_folder(tmp_path / "reviews")
