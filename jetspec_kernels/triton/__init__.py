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
