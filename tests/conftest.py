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


# Property-based tests (tests/test_properties.py): CI runs a few dozen examples per property (seconds); a longer
# search is `python -m pytest tests/test_properties.py --hypothesis-profile=long`. No example database is written
# into the checkout (database=None); a failure prints the example to reproduce it.
from hypothesis import HealthCheck, settings  # noqa: E402

_COMMON = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=25, **_COMMON)
settings.register_profile("long", max_examples=1000, **_COMMON)
settings.load_profile("ci")
