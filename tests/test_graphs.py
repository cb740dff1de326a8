"""The op graphs the autotuner rates and compiles (``runtime.graphs``): captured once, kept in
the process, stored under the cache folder for the next process, captured again where the code
that captures them changed or a stored file does not load."""
import pytest
import torch

from megakernel.compiler.pipeline import model_ops
from megakernel.models import load_model
from megakernel.runtime import graphs


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(graphs, "_graphs", type(graphs._graphs)())
    return load_model("tiny-llama", progress=False).model.config


def captures(monkeypatch) -> list:
    """The batch sizes captured from now on (each a call of ``model_ops``)."""
    seen = []

    def counted(model, batch, seq):
        seen.append(batch)
        return model_ops(model, batch, seq)

    monkeypatch.setattr(graphs, "model_ops", counted)
    return seen


def test_a_graph_is_captured_once_and_the_next_process_loads_it(cfg, monkeypatch):
    seen = captures(monkeypatch)
    ops = graphs.op_graph(cfg, torch.float32, 3, 64)
    assert graphs.op_graph(cfg, torch.float32, 3, 64) is ops and seen == [3]
    assert graphs.stored_path(cfg, torch.float32, 3, 64).is_file()
    graphs._graphs.clear()                                  # as in another process
    again = graphs.op_graph(cfg, torch.float32, 3, 64)
    assert again == ops and again is not ops and seen == [3]
    graphs.op_graph(cfg, torch.float32, 2, 64)              # another batch size is its own
    graphs.op_graph(cfg, torch.bfloat16, 3, 64)             # and another dtype
    assert seen == [3, 2, 3]
    assert ops.dims.batch == 3 and graphs.op_graph(cfg, torch.float32, 2, 64).dims.batch == 2


def test_a_stored_graph_is_captured_again_after_a_code_change_or_when_it_does_not_load(
        cfg, monkeypatch):
    seen = captures(monkeypatch)
    ops = graphs.op_graph(cfg, torch.float32, 2, 64)
    path = graphs.stored_path(cfg, torch.float32, 2, 64)
    graphs._graphs.clear()
    path.write_bytes(b"not a pickle")
    assert graphs.op_graph(cfg, torch.float32, 2, 64) == ops and seen == [2, 2]
    assert graphs.stored_path(cfg, torch.float32, 2, 64).read_bytes() != b"not a pickle"
    graphs._graphs.clear()
    monkeypatch.setattr(graphs, "code_hash", lambda: "changed")
    assert graphs.stored_path(cfg, torch.float32, 2, 64) != path
    graphs.op_graph(cfg, torch.float32, 2, 64)
    assert seen == [2, 2, 2]
    assert not list(path.parent.glob("*.part"))             # no half-written file is left


def test_a_graph_is_still_made_where_the_cache_folder_takes_no_files(cfg, monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")                                  # graphs/ cannot be made under it
    monkeypatch.setenv("MEGAKERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(graphs, "stored_path", lambda *a: blocked / "graphs" / "g.pkl")
    seen = captures(monkeypatch)
    assert graphs.op_graph(cfg, torch.float32, 2, 64).dims.batch == 2 and seen == [2]
