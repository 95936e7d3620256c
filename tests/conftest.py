import os

# Tests never reach the Hugging Face hub: a missing file must fail at once.
for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")


import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def one_thread():
    """One intra-op thread for training tests: the tiny models gain nothing from two, a busy CPU makes spinning
    OpenMP threads very slow, and launched subprocesses (OMP_NUM_THREADS=1) then run the same kernels, so bitwise
    comparisons hold."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
