"""The CUDA kernels' launch constants (threads per block, units a thread, size switches) read from
their headers in csrc/include/jetspec, so that the boundary shapes the op tests build from them
follow a change of the kernel instead of silently testing the old sizes. (The constants that are
part of the launchers' contract are exported as ``_C.LIMITS``; these are the kernels' private
ones.)"""
import re
from pathlib import Path

HEADERS = Path(__file__).resolve().parents[1] / "csrc" / "include" / "jetspec"


def cuda_constant(header: str, name: str) -> int:
    """The value of ``constexpr int|long long name = <integer expression>;`` in ``header``: an
    integer, or integers joined by ``*`` and ``<<`` (``4LL << 20``)."""
    text = (HEADERS / header).read_text()
    m = re.search(rf"constexpr\s+(?:int|long long|int64_t|uint32_t)\s+{name}\s*=\s*([^;]+);", text)
    if m is None:
        raise LookupError(f"no constexpr {name} in {header}")
    expr = re.sub(r"(?<=\d)(?:LL|ll|u|U)\b", "", m.group(1)).strip()
    if not re.fullmatch(r"[0-9\s*<()]+", expr):
        raise ValueError(f"{header}: {name} = {m.group(1)} is not a plain integer expression")
    return int(eval(expr, {"__builtins__": {}}))  # digits, *, << and parentheses only
