"""Both front ends, torch.fx symbolic tracing and the graph Dynamo hands a torch.compile backend,
lower to the same ops and generate the same kernel."""
import pytest

from megakernel.compiler.capture import capture, capture_dynamo, dotted
from megakernel.compiler.pipeline import CompileOptions, compile_graph
from megakernel.models import load_model


def test_dynamo_names_map_back_to_module_names():
    assert dotted("L_self_modules_layers_modules_0_modules_self_attn_modules_q_proj_"
                  "parameters_weight_") == "layers.0.self_attn.q_proj.weight"
    assert dotted("L_self_buffers_inv_freq_") == "inv_freq"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_dynamo_graph_compiles_to_the_same_kernel(name):
    model = load_model(name, progress=False).model
    opts = CompileOptions(3, 64, target="h200", num_workers=8)
    traced = compile_graph(capture(model, 3, 64), opts, 4, name)
    dynamo = compile_graph(capture_dynamo(model, 3, 64), opts, 4, name)
    assert [o.kind for o in dynamo.ops.ops] == [o.kind for o in traced.ops.ops]
    assert dynamo.ops.dims == traced.ops.dims
    assert dynamo.kernel.source == traced.kernel.source
    assert (dynamo.encoded.instructions == traced.encoded.instructions).all()
