"""Backend selection: names, precedence, auto rules, and clear errors (never a silent fallback)."""
from pathlib import Path

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import backend as bk
from jetspec_kernels import device_guard

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _restore_backend():
    before = jk.get_backend()
    yield
    jk.set_backend(before)


def test_set_and_get_backend():
    jk.set_backend("reference")
    assert jk.get_backend() == "reference"
    jk.set_backend("AUTO")
    assert jk.get_backend() == "auto"


def test_unknown_backend_names_the_argument():
    with pytest.raises(ValueError, match="backend must be one of"):
        jk.set_backend("tpu")


def test_auto_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert bk.resolve(torch.device("cpu")) == "reference"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    assert bk.resolve(torch.device("cpu")) == "triton"


def test_explicit_backend_beats_default(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    jk.set_backend("triton")
    assert bk.resolve(torch.device("cpu"), "reference") == "reference"


def test_triton_on_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(jk.BackendUnavailableError, match="backend 'triton' is not available: .*TRITON_INTERPRET"):
        bk.resolve(torch.device("cpu"), "triton")


def test_cuda_on_cpu_tensors_is_refused():
    logits = torch.randn(1, 2, 10)
    with pytest.raises(jk.BackendUnavailableError, match="backend 'cuda' is not available: tensors are on cpu"):
        jk.draft_tree(logits, torch.zeros(1, dtype=torch.int32), budget=4, topk=2, backend="cuda")


def test_missing_kernel_is_reported(monkeypatch):
    import types
    fake = types.ModuleType("fake_backend")
    monkeypatch.setitem(bk._LOADED, "triton", fake)
    with pytest.raises(jk.BackendUnavailableError, match="does not implement build_tree"):
        bk.kernel("triton", "build_tree")


def test_env_variable_sets_default():
    import os
    import subprocess
    import sys
    code = "import jetspec_kernels as jk; print(jk.get_backend())"
    env = {**os.environ, "JETSPEC_BACKEND": "reference"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "reference"
    env["JETSPEC_BACKEND"] = "nope"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "JETSPEC_BACKEND must be one of" in out.stderr


def test_available_backends_lists_reasons():
    avail = jk.available_backends("cpu")
    assert set(avail) == {"cuda", "triton", "reference"}
    assert avail["reference"] is None
    assert "CUDA tensors" in avail["cuda"]


def test_cuda_extension_imports_without_a_gpu():
    C = pytest.importorskip("jetspec_kernels._C", reason="_C not built (no nvcc at install time)")
    if not torch.cuda.is_available():
        assert C.device_count() == 0
    assert C.supports_arch(90) == ("90a" in C.built_archs().split(","))


def test_auto_passes_a_missing_kernel_to_the_next_backend(monkeypatch):
    import types
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    fake = types.ModuleType("fake_backend")
    monkeypatch.setitem(bk._LOADED, "triton", fake)
    assert bk.select(torch.device("cpu"), "build_tree", "auto") is bk.kernel("reference", "build_tree")
    with pytest.raises(jk.BackendUnavailableError, match="does not implement build_tree"):
        bk.select(torch.device("cpu"), "build_tree", "triton")


def test_select_reports_every_reason(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    monkeypatch.setattr(bk, "supports", lambda name, fn, **call: f"no {name}")
    with pytest.raises(jk.BackendUnavailableError) as info:
        bk.select(torch.device("cpu"), "tree_attention", "auto", {})
    assert "backend 'triton' is not available: no triton" in str(info.value)
    assert "backend 'reference' is not available: no reference" in str(info.value)


def test_triton_runs_on_its_tensors_device(monkeypatch):
    """Triton launches on the current CUDA device, so select() wraps a triton kernel for CUDA
    tensors in that device's context when another device is current (here with the CUDA parts
    stubbed: no GPU)."""
    import types
    entered = []

    class FakeDevice:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            entered.append(None)

    fake = types.ModuleType("fake_triton_backend")
    fake.pack_mask = lambda parents, num_nodes: (list(entered), parents + num_nodes)
    monkeypatch.setitem(bk._LOADED, "triton", fake)
    monkeypatch.setattr(bk, "unavailable_reason", lambda name, device: None)
    monkeypatch.setattr(torch.cuda, "device", FakeDevice)
    monkeypatch.setattr(device_guard, "current_cuda_device", lambda: 0)
    dev = torch.device("cuda", 1)
    inside, total = bk.select(dev, "pack_mask", "triton")(2, 3)
    assert inside == [dev] and entered == [dev, None] and total == 5
    entered.clear()   # device 1 current already: no switch
    monkeypatch.setattr(device_guard, "current_cuda_device", lambda: 1)
    assert bk.select(dev, "pack_mask", "triton")(2, 3) == ([], 5) and entered == []
    # while torch.compile traces, always the context (dynamo cannot fold the C device query)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert bk.select(dev, "pack_mask", "triton")(2, 3) == ([dev], 5) and entered == [dev, None]
    assert bk.select(torch.device("cpu"), "pack_mask", "triton") is fake.pack_mask


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_ops_on_a_device_that_is_not_current(backend):
    n = 70
    parents = torch.arange(-1, n - 1, dtype=torch.int32)[None].repeat(2, 1)
    num_nodes = torch.tensor([n, 33], dtype=torch.int32)
    want = jk.pack_mask(parents, num_nodes, backend="reference")
    with torch.cuda.device(0):
        got = jk.pack_mask(parents.to("cuda:1"), num_nodes.to("cuda:1"), backend=backend)
    assert got.device == torch.device("cuda:1") and torch.equal(got.cpu(), want.to(torch.int32))


def test_implements_names_the_fused_hidden_topk_backends(monkeypatch):
    """The cuda backend has no fused hidden_topk (deleted: it lost to Triton's on the H200,
    docs/perf/hidden_topk.md), so draft_tree_from_hidden takes the GEMM method there; auto's candidates
    (and the process default, when auto) always have one; a bad name is a ValueError; the answer
    imports no backend (one that cannot load is select's to explain)."""
    import sys
    monkeypatch.delitem(sys.modules, "jetspec_kernels.triton", raising=False)
    monkeypatch.setitem(sys.modules, "triton", None)        # triton not importable
    assert bk.implements("triton", "hidden_topk") and "jetspec_kernels.triton" not in sys.modules
    assert not bk.implements("cuda", "hidden_topk")
    assert bk.implements("cuda", "log_softmax_topk")
    assert bk.implements("triton", "hidden_topk") and bk.implements("reference", "hidden_topk")
    assert bk.implements("auto", "hidden_topk") and bk.implements("AUTO", "hidden_topk")
    assert bk.implements(None, "hidden_topk") == (bk.get_backend() != "cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        bk.implements("cudnn", "hidden_topk")


@pytest.fixture
def fake_gpu_backends(monkeypatch):
    """Stub backends on a pretend CUDA device (no GPU needed): each interface function returns
    the name of the backend that ran it."""
    import types
    for name in ("cuda", "triton", "reference"):
        mod = types.ModuleType(f"fake_{name}_backend")
        for fn in bk.INTERFACE_FUNCTIONS:
            setattr(mod, fn, lambda *a, _name=name: _name)
        monkeypatch.setitem(bk._LOADED, name, mod)
    monkeypatch.setattr(bk, "unavailable_reason", lambda name, device: None)
    monkeypatch.setattr(device_guard, "current_cuda_device", lambda: 0)   # the pretend device is current
    return torch.device("cuda", 0)


def _unverified(fn):
    """auto's pick for an interface function no GPU backend has passed on hardware."""
    return "reference" if fn in bk.REFERENCE_UNTIL_VERIFIED else "triton"


def test_auto_keeps_cuda_tensors_off_unverified_cuda_kernels(fake_gpu_backends, monkeypatch):
    """Until an op's cuda kernels have passed on a GPU, auto runs it with triton (with the torch
    ops of the reference for REFERENCE_UNTIL_VERIFIED); an explicit backend="cuda" or "triton"
    still runs those kernels."""
    dev = fake_gpu_backends
    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {})
    assert "rms_norm" in bk.REFERENCE_UNTIL_VERIFIED
    for fn in bk.INTERFACE_FUNCTIONS:
        assert bk.select(dev, fn, "auto")() == _unverified(fn)
        assert bk.resolve(dev, fn=fn) == _unverified(fn)
        assert bk.select(dev, fn, "cuda")() == "cuda"
        assert bk.select(dev, fn, "triton")() == "triton"
    assert bk.resolve(dev) == "triton"

    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {"pack_mask": ("cuda",), "verify_tree": ("cuda",),
                                                  "rms_norm": ("triton",)})
    picks = {fn: bk.select(dev, fn, "auto")() for fn in bk.INTERFACE_FUNCTIONS}
    assert picks == {fn: "cuda" if fn in ("pack_mask", "verify_tree") else
                     "triton" if fn == "rms_norm" else _unverified(fn)
                     for fn in bk.INTERFACE_FUNCTIONS}
    assert bk._auto_candidates(dev, "rms_norm") == ("triton", "reference")
    assert bk.resolve(dev, fn="pack_mask") == "cuda" and bk.resolve(dev) == "triton"

    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {fn: ("cuda",) for fn in bk.INTERFACE_FUNCTIONS})
    assert bk.resolve(dev) == "cuda"
    # an op the verified cuda backend cannot take still goes on to triton
    monkeypatch.setattr(bk, "supports", lambda n, fn, **call: "fp32" if n == "cuda" else None)
    assert bk.select(dev, "tree_attention", "auto", {})() == "triton"


def test_auto_runs_the_fastest_hardware_verified_backend(fake_gpu_backends, monkeypatch):
    """Each op's verified backends are tried fastest first; triton (verified or not) follows; an
    unlisted cuda is never auto's choice, also when the listed backend cannot take a call."""
    dev = fake_gpu_backends
    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {"tree_attention": ("triton", "cuda"),
                                                  "commit_kv": ("cuda", "triton"),
                                                  "verify_tree": ("triton",)})
    picks = {fn: bk.select(dev, fn, "auto")() for fn in bk.INTERFACE_FUNCTIONS}
    assert picks == {fn: "cuda" if fn == "commit_kv" else _unverified(fn) for fn in bk.INTERFACE_FUNCTIONS}
    assert bk._auto_candidates(dev, "tree_attention") == ("triton", "cuda", "reference")
    assert bk._auto_candidates(dev, "verify_tree") == ("triton", "reference")
    assert bk.resolve(dev) == "triton" and bk.verified_backends(None) == ()
    monkeypatch.setattr(bk, "supports", lambda n, fn, **call: "no" if n == "triton" else None)
    assert bk.select(dev, "tree_attention", "auto", {})() == "cuda"
    assert bk.select(dev, "verify_tree", "auto", {}) is bk.kernel("reference", "verify_tree")

    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {fn: ("triton", "cuda") for fn in bk.INTERFACE_FUNCTIONS})
    assert bk.verified_backends(None) == ("triton", "cuda") and bk.resolve(dev) == "triton"


def test_a_chain_goes_where_each_of_its_functions_may_go(fake_gpu_backends, monkeypatch):
    """draft_tree (backend.CHAINS: log_softmax_topk then build_tree) is verified for a backend
    only where both functions are, in the first one's order; auto sends it there and never to a
    backend that one of them has not passed on (HARDWARE_VERIFIED holds no chain: the next test)."""
    dev = fake_gpu_backends
    assert bk.CHAINS == {"draft_tree": ("log_softmax_topk", "build_tree")}
    assert set(bk.CHAINS) <= set(bk.INTERFACE_FUNCTIONS)
    for parts in bk.CHAINS.values():
        assert set(parts) <= set(bk.INTERFACE_FUNCTIONS) - set(bk.CHAINS)
    cases = [({}, (), "triton"),
             ({"log_softmax_topk": ("cuda",)}, (), "triton"),
             ({"build_tree": ("cuda",)}, (), "triton"),
             ({"log_softmax_topk": ("cuda",), "build_tree": ("cuda",)}, ("cuda",), "cuda"),
             ({"log_softmax_topk": ("triton", "cuda"), "build_tree": ("cuda", "triton")},
              ("triton", "cuda"), "triton"),
             ({"log_softmax_topk": ("cuda", "triton"), "build_tree": ("triton",),
               "draft_tree": ("cuda",)}, ("triton",), "triton")]   # a listed chain is ignored
    for verified, want, pick in cases:
        monkeypatch.setattr(bk, "HARDWARE_VERIFIED", verified)
        assert bk.verified_backends("draft_tree") == want, verified
        assert bk.select(dev, "draft_tree", "auto")() == pick, verified
        assert bk.select(dev, "draft_tree", "cuda")() == "cuda"


def test_a_chain_of_functions_held_on_the_reference_stays_there(fake_gpu_backends, monkeypatch):
    """A chain with a part in REFERENCE_UNTIL_VERIFIED is held on the reference as that part is
    (a made-up chain of the two fused layer ops), until every part has a verified GPU backend."""
    dev = fake_gpu_backends
    monkeypatch.setattr(bk, "CHAINS", {**bk.CHAINS, "norm_then_act": ("rms_norm", "silu_mul")})
    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {"rms_norm": ("triton",)})
    assert bk._auto_candidates(dev, "rms_norm") == ("triton", "reference")
    assert bk._auto_candidates(dev, "norm_then_act") == ("reference",)
    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {"rms_norm": ("triton",), "silu_mul": ("cuda", "triton")})
    assert bk._auto_candidates(dev, "norm_then_act") == ("triton", "reference")


def test_auto_s_choice_on_cuda_is_worked_out_once(fake_gpu_backends, monkeypatch):
    """select runs on every op call: on a CUDA device auto's candidates come from a cache (a few
    Python calls a select, the chain's included), which a new table replaces."""
    import sys
    dev = fake_gpu_backends
    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {"log_softmax_topk": ("cuda",), "build_tree": ("cuda",)})

    def calls(fn):
        bk.select(dev, fn, "auto")
        n = [0]

        def count(frame, event, arg):
            n[0] += event == "call"
        sys.setprofile(count)
        try:
            got = bk.select(dev, fn, "auto")()
        finally:
            sys.setprofile(None)
        return n[0], got
    assert calls("draft_tree") == (calls("log_softmax_topk")[0], "cuda")
    assert calls("draft_tree")[0] <= 10
    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {"log_softmax_topk": ("cuda",)})
    assert calls("draft_tree")[1] == "triton"


def test_hardware_verified_ops_have_passing_rows_in_the_record():
    """HARDWARE_VERIFIED is the hardware record's ``trusted`` (jetspec_kernels/hardware_record.json),
    and every op x backend trusted there has, for every dtype it lists, a ``passed`` row of an
    H100 / H200 run with its date, commit and files, and no row of that op x backend failed."""
    import json
    import re
    record = json.loads(bk.HARDWARE_RECORD.read_text())
    trusted = record["trusted"]
    assert bk.HARDWARE_VERIFIED == {fn: tuple(e["backends"]) for fn, e in trusted.items()}
    assert set(trusted) <= set(bk.INTERFACE_FUNCTIONS) - set(bk.CHAINS)
    rows = record["rows"]
    for row in rows:
        assert set(row) - {"note"} == {"op", "backend", "dtype", "device", "status", "date", "commit",
                                       "files"}, row
    for fn, entry in trusted.items():
        assert entry["dtypes"], fn
        for b in entry["backends"]:
            mine = [r for r in rows if r["op"] == fn and r["backend"] == b]
            assert all(r["status"] in ("passed", "not run") for r in mine), (fn, b)
            assert {r["dtype"] for r in mine} <= set(entry["dtypes"]), (fn, b)
            for dtype in entry["dtypes"]:
                ok = [r for r in mine if r["dtype"] == dtype and r["status"] == "passed"
                      and re.search(r"H[12]00", r["device"]) and re.fullmatch(r"20\d\d-\d\d-\d\d", r["date"])
                      and re.fullmatch(r"[0-9a-f]{7,40}", r["commit"]) and r["files"]]
                assert ok, (fn, b, dtype)
                for f in ok[0]["files"]:
                    assert (ROOT / f).exists(), f


def test_an_unreadable_hardware_record_names_the_file(tmp_path):
    path = tmp_path / "hardware_record.json"
    path.write_text('{"trusted": {"build_tree": {"backends": ["cuda"]}}, "rows": []}')
    assert bk._trusted_backends(path) == {"build_tree": ("cuda",)}
    for text in ('{"rows": []}', "{", '{"trusted": {"build_tree": {"backends": ["sim"]}}}',
                 '{"trusted": {"build_tree": {"backends": ["cuda", "cuda"]}}}',
                 '{"trusted": {"build_tree": {"backends": []}}}'):
        path.write_text(text)
        with pytest.raises(ValueError, match="hardware record .*hardware_record.json"):
            bk._trusted_backends(path)
    with pytest.raises(ValueError, match="unreadable"):
        bk._trusted_backends(tmp_path / "missing.json")


def test_interface_functions_match_the_backends():
    """INTERFACE_FUNCTIONS names what every backend implements (CONTRIBUTING.md) but what
    OPTIONAL_FUNCTIONS says each lacks (the cuda backend: hidden_topk), and that table is the
    modules' truth: any other function missing from one would make set_backend(<it>) fail every
    model forward that needs it."""
    assert set(bk.OPTIONAL_FUNCTIONS) <= set(bk.INTERFACE_FUNCTIONS)
    assert bk.OPTIONAL_FUNCTIONS == {"hidden_topk": ("cuda",), "gated_delta_tree": ("cuda",),
                                     "gated_delta_commit": ("cuda",),
                                     "causal_conv1d_tree": ("cuda",), "causal_conv1d_commit": ("cuda",)}
    for name in ("reference", "triton", "cuda"):
        module = bk._module(name)
        for fn in bk.INTERFACE_FUNCTIONS:
            assert callable(getattr(module, fn, None)) == bk.implements(name, fn), (name, fn)
    with pytest.raises(bk.BackendUnavailableError, match="has no hidden_topk .an optional"):
        bk.kernel("cuda", "hidden_topk")


def test_cpu_tests_skip_without_c_extension():
    """A build without _C (JETSPEC_SKIP_CUDA_BUILD=1, or no nvcc) skips the tests that need it,
    with a reason, instead of failing them: this file's tests in a process where _C cannot be
    imported."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys; sys.modules['jetspec_kernels._C'] = None; import pytest; "
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-rs', "
            "'tests/test_backend.py', '-k', 'supports_follows or extension_imports']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "_C not built" in proc.stdout and " skipped" in proc.stdout, proc.stdout[-2000:]


def test_cuda_supports_follows_the_kernel_variable(monkeypatch):
    """A call that names no kernel takes JETSPEC_ATTN_KERNEL's: the cuda backend's answer for the
    same shapes changes with the variable (the answers are remembered per signature and kernel,
    so a call before the variable was set must not answer for one after)."""
    pytest.importorskip("jetspec_kernels._C", reason="_C not built: the cuda backend's limits "
                                                     "come from _C.LIMITS")
    q = torch.empty(1, 2, 4, 256, dtype=torch.half)
    kv = torch.empty(1, 16, 2, 256, dtype=torch.half)
    monkeypatch.delenv("JETSPEC_ATTN_KERNEL", raising=False)
    assert bk.supports("cuda", "tree_attention", q=q, k_cache=kv, v_cache=kv) is None
    monkeypatch.setenv("JETSPEC_ATTN_KERNEL", "wgmma")
    assert "head dims (64, 128)" in bk.supports("cuda", "tree_attention", q=q, k_cache=kv,
                                                v_cache=kv)
    monkeypatch.setenv("JETSPEC_ATTN_KERNEL", "mma")
    assert bk.supports("cuda", "tree_attention", q=q, k_cache=kv, v_cache=kv) is None


def test_auto_choice_says_what_auto_picks_and_why(fake_gpu_backends, monkeypatch):
    """auto_choice (``jetspec info``'s line per op) names the backend select's auto runs first,
    the reason, and every candidate passed over with its own reason."""
    dev = fake_gpu_backends
    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {"pack_mask": ("cuda",), "commit_kv": ("cuda",)})
    for fn in bk.INTERFACE_FUNCTIONS:
        name, why = bk.auto_choice(fn, dev)
        assert name == bk.select(dev, fn, "auto")(), fn
    assert "passed its parity tests on hardware" in bk.auto_choice("pack_mask", dev)[1]
    assert "lists no backend" in bk.auto_choice("tree_attention", dev)[1]
    assert "kept on the torch ops" in bk.auto_choice("rms_norm", dev)[1]
    # a verified backend that cannot load here is passed over, and its reason shown
    monkeypatch.setattr(bk, "unavailable_reason",
                        lambda name, device: "no driver" if name == "cuda" else None)
    name, why = bk.auto_choice("commit_kv", dev)
    assert name == "triton" and "passed over cuda: no driver" in why
    # by the tables alone, as where every backend loads
    assert bk.auto_choice("commit_kv", dev, machine=False)[0] == "cuda"
    # a backend lacking the function (an optional one) is passed over too
    monkeypatch.setattr(bk, "HARDWARE_VERIFIED", {"hidden_topk": ("cuda",)})
    monkeypatch.setattr(bk, "unavailable_reason", lambda name, device: None)
    name, why = bk.auto_choice("hidden_topk", dev)
    assert name == "triton" and "cuda: it has no hidden_topk" in why
    with pytest.raises(ValueError, match="fn must be one of"):
        bk.auto_choice("matmul", dev)


def test_auto_choice_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert bk.auto_choice("tree_attention", "cpu")[0] == "reference"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    name, why = bk.auto_choice("tree_attention", "cpu")
    assert name == "triton" and "interpreter" in why
