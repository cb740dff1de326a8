import os
import sys
from pathlib import Path

import pytest
import torch

# Generated kernels run on CPU tensors through the Triton interpreter, which is chosen when the
# op bodies are decorated: set it before any test imports them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
