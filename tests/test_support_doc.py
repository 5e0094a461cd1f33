"""docs/SUPPORT.md is what docs/gen_support.py makes from the code today, and the limits it
reads from csrc/include/jetspec/limits.h are the built extension's."""
import importlib.util
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_support", ROOT / "docs" / "gen_support.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_support_doc_is_current(gen):
    assert (ROOT / "docs" / "SUPPORT.md").read_text() == gen.render(), \
        "docs/SUPPORT.md is stale: run python docs/gen_support.py"


def test_support_doc_has_every_public_op(gen):
    import jetspec_kernels as jk
    ops = {name for name in jk.__all__ if callable(getattr(jk, name)) and name[0].islower()
           and name not in ("available_backends", "get_backend", "set_backend", "set_value_checks",
                            "choose_budget", "choose_budget_from_topk", "expected_accept_curve",
                            "expected_accept_curve_from_topk")}
    documented = set(re.findall(r"^## `(\w+)`", (ROOT / "docs" / "SUPPORT.md").read_text(), re.M))
    assert documented == ops


def test_kernel_limits_are_the_built_extensions(gen):
    _C = pytest.importorskip("jetspec_kernels._C", reason="the CUDA extension is not built")
    parsed = gen.kernel_limits()
    for c_name, key in [("kAttnHeadDims", "attn_head_dims"), ("kWgmmaHeadDims", "wgmma_head_dims"),
                        ("kRopeMaxHeadDim", "rope_max_head_dim"), ("kWalkMaxNodes", "walk_max_nodes"),
                        ("kRowAlignBytes", "row_align_bytes"),
                        ("kAttnTmaPageMultiple", "attn_tma_page_multiple"),
                        ("kTopPMaxVocab", "top_p_max_vocab")]:
        assert parsed[c_name] == _C.LIMITS[key], c_name


def test_cuda_attention_claims_hold(gen):
    """The doc's cuda attention row: float16/bfloat16 only, the listed head dims and no other."""
    pytest.importorskip("jetspec_kernels._C", reason="the CUDA extension is not built")
    from jetspec_kernels.cuda.supports import supports
    dims = gen.kernel_limits()["kAttnHeadDims"]
    cache = torch.empty(1, 8, 1, 64, dtype=torch.float16)
    for d in range(8, 513, 8):
        q = torch.empty(1, 1, 1, d, dtype=torch.float16)
        kv = torch.empty(1, 8, 1, d, dtype=torch.float16)
        assert (supports("tree_attention", q=q, k_cache=kv, v_cache=kv, kernel="mma") is None) == \
            (d in dims), d
    q32 = torch.empty(1, 1, 1, 64)
    assert "float16/bfloat16" in supports("tree_attention", q=q32, k_cache=cache.float(),
                                          v_cache=cache.float(), kernel="mma")
