"""Models for JetSpec decoding: a minimal Qwen3 target, the draft head, checkpoint loading.

``Qwen3.from_pretrained(path, *, dtype, device)`` loads a Hugging Face Qwen3 checkpoint,
``Qwen3_5.from_pretrained`` a Qwen3.5 / Qwen3.6 hybrid, ``load_target`` either by model_type;
``DraftHead.from_pretrained(path, *, dtype, device)`` a JetSpec / DFlash draft head;
``tiny_models()`` builds small random ones for tests and demos.
"""
from .checkpoint import CheckpointError, load_safetensors, save_safetensors
from .config import DraftConfig, Qwen3_5Config, Qwen3Config, default_target_layer_ids
from .draft_head import DraftHead, DraftState
from .kv_cache import KVCache
from .qwen3 import Qwen3
from .qwen3_5 import HybridCache, Qwen3_5
from .target import load_target
from .tiny import save_draft_head, save_qwen3, tiny_models

__all__ = ["CheckpointError", "DraftConfig", "DraftHead", "DraftState", "HybridCache", "KVCache",
           "Qwen3", "Qwen3Config", "Qwen3_5", "Qwen3_5Config", "default_target_layer_ids",
           "load_safetensors", "load_target", "save_draft_head", "save_qwen3", "save_safetensors",
           "tiny_models"]
