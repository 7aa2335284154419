import os

import pytest
import torch
from text_tiny import write_review_folder

# Two cores: one intra-op thread per test process keeps timings and results stable.
torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The processes tests start (tests/*_worker.py under torchrun or accelerate launch, scripts/) import this checkout's
# package, as the tests do, whichever copy an environment has installed.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
# cuBLAS reads it when it starts; deterministic algorithms on CUDA need it (tests/test_gpu.py's resume test).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def pytest_collection_modifyitems(config, items):
    # The multi-process (slow) tests first: under pytest-xdist (make test) their files then start first and the
    # workers finish together, instead of one running the longest files alone at the end.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False); make gpu-check runs it")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def output_dir(tmp_path):
    return str(tmp_path / "out")


@pytest.fixture
def review_folder(tmp_path):
    """A local dataset in the Hub layout: a 'review' column and string labels."""
    return write_review_folder(tmp_path / "reviews")
