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


def pytest_addoption(parser):
    parser.addoption("--shard", default="1/1", metavar="I/N",
                     help="run only the I-th of N equal shares of the selected tests (every "
                          "N-th from the I-th: GPU suites split over calls of a time limit)")


def pytest_collection_modifyitems(config, items):
    i, n = _shard(config.getoption("--shard"))
    if n > 1:
        config.hook.pytest_deselected(items=[t for j, t in enumerate(items) if j % n != i - 1])
        items[:] = items[i - 1::n]
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard {text!r}: expected I/N, e.g. 1/2") from None
    if not 1 <= i <= n:
        raise pytest.UsageError(f"--shard {text!r}: I must be 1 to N")
    return i, n
