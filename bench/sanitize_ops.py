"""Run every public op once on small CUDA inputs with one backend, and compare to the reference.

Meant to run under ``compute-sanitizer`` (memcheck, racecheck) from bench/device_check.sh: sizes
are small and deliberately off tile boundaries (float64 python_ref is the yardstick) (N = 40 nodes: two mask words; prefix 100; paged
caches with a shuffled block table). Ops the backend does not implement are reported as skipped.

    python bench/sanitize_ops.py --backend cuda      # exit 1 if any op fails or mismatches
"""
from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from bench import common as bc

B, N, HQ, HKV, DH, L, V, D, K, PAGE = 2, 40, 8, 2, 128, 100, 1000, 6, 4, 16


def rel(x, y) -> float:
    x, y = x.double().cpu(), y.double().cpu()
    return float((x - y).norm() / y.norm().clamp_min(1e-30))


def cases(dev, dtype, backend):
    """(name, fn) pairs; fn runs the op on ``backend`` and returns None or a mismatch message."""
    g = torch.Generator(device=dev).manual_seed(0)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    logits = torch.randn(B, D, V, device=dev, generator=g) * 3
    root = torch.randint(0, V, (B,), device=dev, dtype=torch.int32, generator=g)
    ref_tree = jk.draft_tree(logits.cpu(), root.cpu(), budget=N, topk=K, backend="reference")
    tree = jk.Tree(*(getattr(ref_tree, f).to(dev) for f in
                     ("tokens", "parents", "depths", "scores", "num_nodes", "mask")),
                   max_depth=ref_tree.max_depth)
    prefix = torch.tensor([L, L - 37], dtype=torch.int32, device=dev)
    q = torch.randn(B, N, HQ, DH, device=dev, generator=g).to(dtype)
    k = torch.randn(B, N, HKV, DH, device=dev, generator=g).to(dtype)
    v = torch.randn(B, N, HKV, DH, device=dev, generator=g).to(dtype)
    kc = torch.randn(B, L + N, HKV, DH, device=dev, generator=g).to(dtype)
    vc = torch.randn(B, L + N, HKV, DH, device=dev, generator=g).to(dtype)
    pages_per_seq = -(-(L + N) // PAGE)
    table = torch.randperm(B * pages_per_seq, device=dev, generator=g).view(B, -1).to(torch.int32)
    kp = torch.randn(B * pages_per_seq, PAGE, HKV, DH, device=dev, generator=g).to(dtype)
    vp = torch.randn_like(kp)
    target = torch.randn(B, N, V, device=dev, generator=g)

    def same_tree(t, r):
        for f in ("tokens", "parents", "depths", "num_nodes", "mask"):
            if not torch.equal(getattr(t, f).cpu(), getattr(r, f)):
                return f"tree field {f} differs from the reference"
        return None

    def c_pack_mask():
        m = jk.pack_mask(tree.parents, tree.num_nodes, backend=backend)
        return None if torch.equal(m.cpu(), ref_tree.mask) else "mask differs"

    def c_draft_tree(alg):
        def run():
            t = jk.draft_tree(logits, root, budget=N, topk=K, algorithm=alg, backend=backend)
            return same_tree(t, jk.draft_tree(logits.cpu(), root.cpu(), budget=N, topk=K,
                                              algorithm=alg, backend="reference"))
        return run

    def c_from_hidden():
        hid = torch.randn(B, D, 64, device=dev, generator=g).to(dtype)
        w = torch.randn(V, 64, device=dev, generator=g).to(dtype)
        t = jk.draft_tree_from_hidden(hid, w, root, budget=N, topk=K, backend=backend)
        return None if t.num_nodes.cpu().tolist() == [N] * B else "wrong node count"

    def c_attention(paged, lse):
        def run():
            kk, vv, bt = (kp, vp, table) if paged else (kc, vc, None)
            out = jk.tree_attention(q, kk, vv, prefix, tree.mask, block_table=bt,
                                    return_lse=lse, backend=backend)
            want, want_lse = ref.tree_attention(q.cpu().double(), kk.cpu().double(),
                                                vv.cpu().double(), prefix.cpu(), tree.mask.cpu(),
                                                "causal", None if bt is None else bt.cpu())
            err = rel(out[0], want) if lse else rel(out, want)
            if lse:
                err = max(err, rel(out[1], want_lse))
            return None if err < tol else f"rel err {err:.2e} >= {tol}"
        return run

    def c_attention_kernel(kernel):
        # The cuda backend's other attention kernels (auto takes wgmma on sm_90a).
        def run():
            with bc.using_attention_kernel(kernel):
                return c_attention(True, True)()
        return run

    def c_rope(paged):
        def run():
            kk, vv, bt = (kp.clone(), vp.clone(), table) if paged else (kc.clone(), vc.clone(), None)
            w = torch.rand(DH, device=dev, generator=g).to(dtype) + 0.5
            pos = tree.positions(prefix)
            out = jk.qk_norm_rope_append(q, k, v, w, w, pos, kk, vv, rope_theta=1e6, cache_start=prefix,
                                         block_table=bt, backend=backend)
            kr, vr = kk.cpu().double(), vv.cpu().double()
            want = ref.qk_norm_rope_append(q.cpu().double(), k.cpu().double(), v.cpu().double(),
                                           w.cpu().double(), w.cpu().double(), pos.cpu(), kr, vr,
                                           1e6, block_table=None if bt is None else bt.cpu(),
                                           cache_start=prefix.cpu())
            err = max(rel(out, want), rel(kk, kr))
            return None if err < tol else f"rel err {err:.2e} >= {tol}"
        return run

    def c_verify(temp):
        def run():
            kw = dict(temperature=temp, seed=torch.full((B,), 7, dtype=torch.int64, device=dev),
                      offset=torch.zeros(B, dtype=torch.int64, device=dev)) if temp else {}
            got = jk.verify_tree(tree, target, backend=backend, **kw)
            kw_cpu = {k_: (x.cpu() if torch.is_tensor(x) else x) for k_, x in kw.items()}
            want = jk.verify_tree(ref_tree, target.cpu(), backend="reference", **kw_cpu)
            ok = all(torch.equal(a.cpu(), b) for a, b in zip(got, want))
            return None if ok else "verdict differs from the reference"
        return run

    def c_commit():
        # The verdict comes from the reference, so a missing verify_tree cannot hide commit_kv.
        verdict = jk.verify_tree(ref_tree, target.cpu(), backend="reference")
        verdict = jk.Verdict(*(x.to(dev) for x in verdict))
        hidden = torch.randn(B, N, 64, device=dev, generator=g).to(dtype)
        kk, vv = kc.clone(), vc.clone()
        res = jk.commit_kv(kk, vv, prefix, verdict, hidden=hidden, backend=backend)
        kr, vr = kc.cpu().clone(), vc.cpu().clone()
        want = jk.commit_kv(kr, vr, prefix.cpu(), jk.Verdict(*(x.cpu() for x in verdict)),
                            hidden=hidden.cpu(), backend="reference")
        ok = (torch.equal(kk.cpu(), kr) and torch.equal(vv.cpu(), vr)
              and torch.equal(res.prefix_lens.cpu(), want.prefix_lens)
              and torch.equal(res.hidden.cpu(), want.hidden))
        return None if ok else "cache or hidden rows differ from the reference"

    return [
        ("pack_mask", c_pack_mask),
        ("draft_tree/topn", c_draft_tree("topn")),
        ("draft_tree/accum_logp", c_draft_tree("accum_logp")),
        ("draft_tree_from_hidden", c_from_hidden),
        ("tree_attention/contiguous", c_attention(False, False)),
        ("tree_attention/paged+lse", c_attention(True, True)),
        *([("tree_attention/paged+lse, mma.sync kernel", c_attention_kernel("mma"))]
          if backend == "cuda" else []),
        ("qk_norm_rope_append/contiguous", c_rope(False)),
        ("qk_norm_rope_append/paged", c_rope(True)),
        ("verify_tree/greedy", c_verify(0.0)),
        ("verify_tree/sample", c_verify(1.0)),
        ("commit_kv", c_commit),
        # Last: a fault in it would break the CUDA context of every case after it.
        *([("tree_attention/paged+lse, hopper kernel", c_attention_kernel("hopper"))]
          if backend == "cuda" and bc.hopper_kernel_enabled() else []),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--device", default=None, help="default cuda when available")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "fp16", "bf16"])
    a = p.parse_args(argv)
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    failed = 0
    for name, fn in cases(dev, dtype, a.backend):
        try:
            msg = fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
        except jk.BackendUnavailableError as e:
            print(f"SKIP  {name}: {e}")
            continue
        except Exception as e:
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3)
            continue
        if msg is None:
            print(f"OK    {name}")
        else:
            failed += 1
            print(f"FAIL  {name}: {msg}")
    print(f"sanitize_ops: backend {a.backend} on {dev}: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
