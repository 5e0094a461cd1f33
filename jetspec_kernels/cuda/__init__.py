"""The ``cuda`` backend: ``torch.library.custom_op`` wrappers over the torch-free ``_C`` module.

Each op allocates its outputs, passes ``data_ptr()`` integers and the current stream to ``_C``,
and registers a fake implementation so it traces under ``torch.compile`` and CUDA-graph capture.
Functions follow the backend interface in CONTRIBUTING.md; ops that are not here yet make the
dispatcher raise ``BackendUnavailableError``.
"""
from .pack_mask import pack_mask  # noqa: F401
