"""Grid and block sizes for the launchers in plain Python: ``triton.cdiv`` and
``triton.next_power_of_2`` are constexpr functions, which cost microseconds per call on the host
(docs/perf/decode_round.md, "Host time per eager call"). Same results as Triton's for n >= 0."""


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for b > 0."""
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for n = 0, like Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
