"""_C's calling convention (csrc/include/jetspec/launcher_args.h): each launcher takes its
params.h field list, then ``stream``, then its optional fields, by position or keyword; a missing,
unknown, repeated or mistyped argument is a TypeError naming it, a value that does not fit a
ValueError naming it. Runs on the CPU through the simulated ``_C`` (the same bindings)."""
import re
import shutil

import pytest
import torch

import jetspec_kernels as jk
from helpers import sim_module
from test_cuda_errors import ARGS, Buffers


@pytest.fixture
def sim():
    if shutil.which("g++") is None:
        pytest.skip("the CUDA simulator needs g++")
    return sim_module()


def kwargs(sim, op, B, **changes):
    """The baseline call of ``op`` (test_cuda_errors) as keyword arguments."""
    names = [f[0] for f in sim.FIELDS[op]]
    return dict(zip(names, ARGS[op](B, **changes)))


@pytest.mark.parametrize("op", sorted(ARGS))
def test_keyword_calls_work_in_any_order(sim, op):
    B = Buffers()
    kw = kwargs(sim, op, B)
    getattr(sim, op)(**dict(reversed(kw.items())))


def test_keyword_names_made_at_run_time_are_found(sim):
    """Keywords are matched by identity with _C's interned names first, then by text: names that
    are not interned (built at run time) work the same, unknown and repeated ones still raise."""
    B = Buffers()
    kw = kwargs(sim, "verify_walk", B)
    fresh = {"".join(list(k)): v for k, v in kw.items()}
    assert all(a is not b for a, b in zip(fresh, kw) if len(a) > 1)  # one-letter str are cached
    sim.verify_walk(**fresh)
    sim.verify_walk(**dict(reversed(fresh.items())))
    prefix = r"^jetspec_kernels\._C\.verify_walk: "
    with pytest.raises(TypeError, match=prefix + "unexpected argument 'batchx'$"):
        sim.verify_walk(**fresh, **{"".join(["batch", "x"]): 1})
    first = next(iter(fresh))
    with pytest.raises(TypeError, match=prefix + f"got multiple values for argument '{first}'$"):
        sim.verify_walk(fresh[first], **fresh)
    with pytest.raises(TypeError, match=prefix + "missing argument 'batch'$"):
        sim.verify_walk(**{k: v for k, v in fresh.items() if k != "batch"})


def test_argument_errors_name_the_argument(sim):
    B = Buffers()
    kw = kwargs(sim, "tree_attention", B)
    prefix = r"^jetspec_kernels\._C\.tree_attention: "
    with pytest.raises(TypeError, match=prefix + "missing argument 'page_size'$"):
        sim.tree_attention(**{k: v for k, v in kw.items() if k != "page_size"})
    with pytest.raises(TypeError, match=prefix + "unexpected argument 'pagesize'$"):
        sim.tree_attention(**kw, pagesize=16)
    with pytest.raises(TypeError, match=prefix + "got multiple values for argument 'q'$"):
        sim.tree_attention(kw["q"], **kw)
    with pytest.raises(TypeError, match=prefix + "argument 'page_size' must be int, got float$"):
        sim.tree_attention(**{**kw, "page_size": 16.0})
    with pytest.raises(TypeError, match=prefix + "argument 'q' must be int .*, got str$"):
        sim.tree_attention(**{**kw, "q": "0"})
    with pytest.raises(TypeError, match=prefix + "argument 'scale' must be float, got NoneType$"):
        sim.tree_attention(**{**kw, "scale": None})
    wrong = r"argument 'k_cache_strides' must be list\[int\].*, got int$"
    with pytest.raises(TypeError, match=prefix + wrong):
        sim.tree_attention(**{**kw, "k_cache_strides": 3})
    with pytest.raises(TypeError, match=prefix + "takes 30 arguments, got 31 positional$"):
        sim.tree_attention(*kw.values(), 0)
    with pytest.raises(TypeError, match=r"verify_walk: argument 'n' must be int, got bool$"):
        sim.verify_walk(**{**kwargs(sim, "verify_walk", B), "n": True})
    with pytest.raises(TypeError, match=r"verify_sample_filter: argument 'vec' must be bool, got int"):
        sim.verify_sample_filter(**{**kwargs(sim, "verify_sample_filter", B), "vec": 1})
    build = kwargs(sim, "build_tree", B)
    sim.build_tree(**build, steps=0)  # the one optional argument
    with pytest.raises(TypeError, match=r"build_tree: missing argument 'budget'$"):
        sim.build_tree(**{k: v for k, v in build.items() if k != "budget"})


def test_page_size_and_cache_outer_are_taken_by_name(sim):
    """Swapping the two keywords' order changes nothing: each lands in its own field."""
    gen = torch.Generator().manual_seed(0)
    h = torch.float16
    q = torch.randn(1, 4, 2, 64, generator=gen).to(h)
    pages = torch.randn(3, 16, 1, 64, generator=gen).to(h)     # 3 pages of 16 rows
    vpages = torch.randn(3, 16, 1, 64, generator=gen).to(h)
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    prefix = torch.tensor([20], dtype=torch.int32)
    outs = []
    for order in (("page_size", "cache_outer"), ("cache_outer", "page_size")):
        out = torch.zeros_like(q)
        sizes = {"page_size": 16, "cache_outer": 3}
        kw = dict(q=q.data_ptr(), q_strides=list(q.stride()[:3]), k_cache=pages.data_ptr(),
                  v_cache=vpages.data_ptr(), k_cache_strides=list(pages.stride()[:3]),
                  v_cache_strides=list(vpages.stride()[:3]), block_table=table.data_ptr(),
                  block_table_batch_stride=2,
                  **{name: sizes[name] for name in order}, prefix_lens=prefix.data_ptr(),
                  tree_mask=0, tree_mask_batch_stride=0, tree_mask_row_stride=0, tail=1,
                  out=out.data_ptr(), out_strides=list(out.stride()[:3]), lse=0, partial_o=0,
                  partial_lse=0, batch=1, n=4, hq=2, hkv=1, splits=1, scale=0.125,
                  dtype=1, head_dim=64, kernel=1, stream=0)
        sim.tree_attention(**kw)
        outs.append(out)
    k = torch.cat([pages[2], pages[0]])[None]
    v = torch.cat([vpages[2], vpages[0]])[None]
    want = jk.tree_attention(q.float(), k.float(), v.float(), prefix, tail="causal", scale=0.125,
                             backend="reference")
    for out in outs:
        assert (out.float() - want).abs().max() < 2e-2
    assert torch.equal(outs[0], outs[1])


def test_field_lists_are_the_baseline_keywords(sim):
    """tests/test_cuda_errors.py builds each baseline call as a dict in positional order; its
    keys are the field names (so the lists were not reordered)."""
    import inspect

    import test_cuda_errors as E
    for op, build in ARGS.items():
        src = inspect.getsource(build)
        keys = re.findall(r"(\w+)=", src.split("a.update")[0].split("dict(", 1)[1])
        assert keys == [f[0] for f in sim.FIELDS[op] if not f[2]], op
        assert len(build(E.Buffers())) == len(keys)
    assert E.ARGS is ARGS


def test_argument_conversion_errors_are_the_callers_or_name_the_argument(sim):
    """An argument whose __index__ raises passes that exception on (not a SystemError, not a
    wrong value); an int past float64's range for a float argument is a ValueError naming it."""
    B = Buffers()
    kw = kwargs(sim, "verify_walk", B)

    class Bad:
        def __index__(self):
            raise KeyError("from __index__")

    for name in ("batch", "tokens", "target_batch_stride"):
        with pytest.raises(KeyError, match="from __index__"):
            sim.verify_walk(**{**kw, name: Bad()})
    att = kwargs(sim, "tree_attention", B)
    with pytest.raises(ValueError, match=r"tree_attention: argument 'scale' does not fit float64$"):
        sim.tree_attention(**{**att, "scale": 10**400})
    sim.tree_attention(**{**att, "scale": 1})   # an int is a float argument's value
