"""The mark for a test that needs a CUDA device: it skips cleanly without one (CI never has a GPU),
and benchmarks/gpu_check.py runs every test that carries it (tests/test_gpu_check.py holds its list
to them)."""

import pytest
import torch

NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
