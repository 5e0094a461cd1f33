"""Models for JetSpec decoding: a minimal Qwen3 target, the draft head, checkpoint loading.

``Qwen3.from_pretrained(path, *, dtype, device)`` loads a Hugging Face Qwen3 checkpoint;
``DraftHead.from_pretrained(path, *, dtype, device)`` a JetSpec / DFlash draft head;
``tiny_models()`` builds small random ones for tests and demos.
"""
from .checkpoint import CheckpointError, load_safetensors, save_safetensors
from .config import DraftConfig, Qwen3Config, default_target_layer_ids
from .draft_head import DraftHead, DraftState
from .kv_cache import KVCache
from .qwen3 import Qwen3
from .tiny import save_draft_head, save_qwen3, tiny_models

__all__ = ["CheckpointError", "DraftConfig", "DraftHead", "DraftState", "KVCache", "Qwen3",
           "Qwen3Config", "default_target_layer_ids", "load_safetensors", "save_draft_head",
           "save_qwen3", "save_safetensors", "tiny_models"]
