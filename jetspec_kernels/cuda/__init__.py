"""The ``cuda`` backend: ``torch.library.custom_op`` wrappers over the torch-free ``_C`` module.

Each op allocates its outputs, passes ``data_ptr()`` integers, strides (elements) and the current
stream to ``_C``, and registers a fake implementation so it traces under ``torch.compile`` and
CUDA-graph capture. Functions follow the backend interface in CONTRIBUTING.md.
"""
from .attention import tree_attention  # noqa: F401
from .commit import commit_kv  # noqa: F401
from .draft_tree import build_tree, hidden_topk, log_softmax_topk  # noqa: F401
from .pack_mask import pack_mask  # noqa: F401
from .rope import qk_norm_rope_append  # noqa: F401
from .supports import supports  # noqa: F401
from .verify import verify_tree  # noqa: F401
