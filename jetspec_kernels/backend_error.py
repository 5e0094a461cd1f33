"""The error a backend that cannot run an op raises: below the backend choice (which raises it for
a backend it cannot use) and the backends (which raise it for calls their kernels cannot take)."""


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run the op on these tensors (the message says why)."""
