"""The ``triton`` backend: Triton kernels for every op (CONTRIBUTING.md, backend interface).

Runs on CUDA GPUs, and on the CPU under ``TRITON_INTERPRET=1`` (how CI checks the kernels'
logic; the interpreter cannot do ``tl.dot`` in bf16, so CPU tests use fp32 and fp16).
Submodules are imported on first use so that importing the package does not import triton.
"""
import importlib

_FUNCTIONS = {
    "tree_attention": "attention",
    "log_softmax_topk": "topk",
    "hidden_topk": "topk",
    "build_tree": "tree_build",
    "pack_mask": "tree_build",
    "qk_norm_rope_append": "rope",
    "verify_tree": "verify",
    "commit_kv": "commit",
}
ATTENTION_HEAD_DIMS = (16, 32, 64, 128, 256)


def supports(op: str, **call) -> str | None:
    """None when the triton backend's ``op`` takes these arguments (by name, as in the backend
    interface; absent ones are not checked), else why not."""
    q = call.get("q")
    if op == "tree_attention" and q is not None and q.shape[-1] not in ATTENTION_HEAD_DIMS:
        return (f"tree_attention does not support q head dim {q.shape[-1]} "
                f"(supported: {ATTENTION_HEAD_DIMS})")
    return None


def __getattr__(name):
    module = _FUNCTIONS.get(name)
    if module is None:
        raise AttributeError(name)
    try:
        mod = importlib.import_module(f".{module}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{module}":
            raise
        raise AttributeError(name) from None
    return getattr(mod, name)
