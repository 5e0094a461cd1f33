"""The ``cuda`` backend: ``torch.library.custom_op`` wrappers over the torch-free ``_C`` module.

Each op allocates its outputs, passes ``data_ptr()`` integers, strides (elements) and the current
stream to ``_C``, and registers a fake implementation so it traces under ``torch.compile`` and
CUDA-graph capture. One module per interface function of the backend interface in
CONTRIBUTING.md, named after it; the package re-exports each function under that name (so
``jetspec_kernels.cuda.verify_tree`` is the function: import a module's other names with
``from jetspec_kernels.cuda.verify_tree import ...``).
"""
from .build_tree import build_tree  # noqa: F401
from .commit_kv import commit_kv  # noqa: F401
from .draft_tree import draft_tree  # noqa: F401
from .log_softmax_topk import log_softmax_topk  # noqa: F401
from .pack_mask import pack_mask  # noqa: F401
from .qk_norm_rope_append import qk_norm_rope_append  # noqa: F401
from .rms_norm import rms_norm  # noqa: F401
from .silu_mul import silu_mul  # noqa: F401
from .supports import supports  # noqa: F401
from .tree_attention import tree_attention  # noqa: F401
from .verify_tree import verify_tree  # noqa: F401
