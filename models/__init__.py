"""Model definitions, configs, weights and tokenizers (``megakernel.models``)."""
from .config import Llama3RopeScaling, ModelConfig, UnsupportedModelError
from .loader import DTYPES, LoadedModel, load_model, parse_dtype
from .presets import PRESETS
from .tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from .transformer import CausalLM
from .weights import CheckpointError, load_checkpoint, random_model

__all__ = [
    "ByteTokenizer", "CausalLM", "CheckpointError", "DTYPES", "HFTokenizer", "Llama3RopeScaling",
    "LoadedModel", "ModelConfig", "PRESETS", "UnsupportedModelError", "load_checkpoint",
    "load_model", "load_tokenizer", "parse_dtype", "random_model",
]
