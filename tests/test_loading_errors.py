"""Bad checkpoints fail with messages that name the problem."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_checkpoints import write_checkpoint
from megakernel.models import (PRESETS, CheckpointError, ModelConfig, UnsupportedModelError,
                               load_model)


def edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_unsupported_architecture_is_named(tmp_path):
    write_checkpoint("llama", tmp_path)
    edit_config(tmp_path, architectures=["MistralForCausalLM"], model_type="mistral")
    with pytest.raises(UnsupportedModelError, match="MistralForCausalLM"):
        load_model(str(tmp_path), progress=False)


def test_unknown_rope_type_is_named(tmp_path):
    write_checkpoint("llama", tmp_path)
    edit_config(tmp_path, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0})
    with pytest.raises(UnsupportedModelError, match="yarn"):
        load_model(str(tmp_path), progress=False)


@pytest.mark.parametrize("key", ["attention_bias", "use_sliding_window"])
def test_unsupported_flags_are_named(tmp_path, key):
    write_checkpoint("qwen3", tmp_path)
    edit_config(tmp_path, **{key: True})
    with pytest.raises(UnsupportedModelError, match=key):
        load_model(str(tmp_path), progress=False)


def rewrite_tensors(folder, mutate):
    """Load model.safetensors, let ``mutate`` edit the dict, write it back."""
    state = load_file(folder / "model.safetensors")
    mutate(state)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor_is_named(tmp_path):
    write_checkpoint("llama", tmp_path)
    rewrite_tensors(tmp_path, lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"layers\.1\.mlp\.up_proj\.weight"):
        load_model(str(tmp_path), progress=False)


def test_misshaped_tensor_names_both_shapes(tmp_path):
    write_checkpoint("llama", tmp_path)
    rewrite_tensors(tmp_path, lambda s: s.update(
        {"model.layers.0.self_attn.k_proj.weight": torch.zeros(25, 72)}))
    with pytest.raises(CheckpointError, match=r"k_proj.*\(25, 72\).*\(24, 72\)"):
        load_model(str(tmp_path), progress=False)


def test_unexpected_tensor_is_named(tmp_path):
    write_checkpoint("llama", tmp_path)
    rewrite_tensors(tmp_path, lambda s: s.update({"model.layers.0.mystery.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match="mystery"):
        load_model(str(tmp_path), progress=False)


def test_missing_shard_and_config_are_named(tmp_path):
    write_checkpoint("llama", tmp_path, max_shard_size="40KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(CheckpointError, match=shard.name):
        load_model(str(tmp_path), progress=False)
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(tmp_path), progress=False)


def test_legacy_llama_32_config_parses_like_the_preset():
    """The layout of the public Llama-3.2-1B config.json (rope_theta + rope_scaling)."""
    hf = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu",
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
        "attention_bias": False, "mlp_bias": False,
    }
    assert ModelConfig.from_hf(hf) == PRESETS["llama-3.2-1b"]


def test_inv_freq_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hf_checkpoints import LLAMA

    hf_cfg = LlamaConfig(**LLAMA)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    ours = ModelConfig.from_hf(hf_cfg.to_dict() | {"architectures": ["LlamaForCausalLM"]})
    assert torch.equal(ours.inv_freq(), ref)
