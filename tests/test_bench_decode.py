"""bench_decode and what it relies on, checked on the CPU so that GPU minutes go to measuring:
the round and the AR step read nothing on the host (a fake capture: decode_round.HostReads
refuses every host read outside the kernels), allocate the same shapes every round, cut into the
stage groups the bench times, the launch counts behind the predictions, the floors and the memory
estimator against hand-computed values, the bench's predicted device time, resume and exit codes."""
import csv
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is a top-level package of the checkout, not installed
    sys.path.insert(0, str(ROOT))

import jetspec_kernels as jk  # noqa: E402
from bench import bench_decode as bd  # noqa: E402
from bench import decode_costs as dc  # noqa: E402
from bench import decode_round as dr  # noqa: E402
from bench import model_setup as ms  # noqa: E402
from jetspec_kernels.models import DraftHead, Qwen3  # noqa: E402
from jetspec_kernels.models.tiny import (random_draft_weights, random_qwen3_weights,  # noqa: E402
                                         tiny_draft_config, tiny_qwen3_config)

CPU = torch.device("cpu")


@pytest.fixture
def round_backend():
    """The reference backend with value checks off: on CUDA tensors the ops check no values, so
    a round's only host reads are its own (the kernels are opaque to HostReads)."""
    prev = jk.get_backend()
    jk.set_backend("reference")
    jk.set_value_checks("never")
    yield
    jk.set_value_checks("cpu")
    jk.set_backend(prev)


def _prefilled(size, budget=16, batch=2, prompt=12, grouped=True):
    m = ms.build(CPU, torch.float32, size=size, with_target=True)
    if grouped:
        m.target.experts_grouped_mm = True
    tokens = torch.randint(0, m.target.config.vocab_size, (batch, prompt),
                           generator=torch.Generator().manual_seed(3))
    cap = dr.capacity(prompt, 12, budget, m.head.block_size)
    pre = dr.prefill(m.target, m.head, tokens, cap, 5, lambda f: dr.wall(f, False))
    return m, pre


@pytest.mark.parametrize("size", ["tiny", "tiny_moe"])
def test_round_and_ar_step_read_nothing_on_the_host(size, round_backend):
    """A fake capture: after one eager round, the round's two steps and the AR step run under a
    guard that raises on any host read (item, tolist, bool, nonzero, boolean masks, cross-device
    copies, synchronize). generate's loop then reads exactly one value per round (the done flags)."""
    m, pre = _prefilled(size)
    rnd = dr.new_round(m.target, m.head, pre, 16, 4, 200)
    rnd.draft_step(True)
    rnd.verify_step(16)
    ar = dr.ARStep(m.target, pre)
    ar()
    with dr.HostReads(refuse=True):
        for _ in range(2):
            rnd.draft_step(True)
            rnd.verify_step(16)
            ar()
    with dr.HostReads() as reads:
        for _ in range(3):
            if bool(rnd.out.done.all()):
                break
            rnd.draft_step(True)
            rnd.verify_step(16)
    assert reads.reads == ["torch function __bool__"] * 3


def test_host_reads_are_caught(round_backend):
    """Each kind of host read raises under refuse=True (the guard can fail); CPU scalars made
    from Python numbers and the kernels' own reads do not count; the MoE loop over experts
    (torch without a grouped GEMM) is caught."""
    x = torch.arange(6.0)
    reads = [lambda: x.sum().item(), lambda: x.tolist(), lambda: bool(x[0]), lambda: int(x[1]),
             lambda: x.nonzero(), lambda: x[x > 2], lambda: torch.equal(x, x),
             lambda: torch.cuda.synchronize()]
    for fn in reads:
        with pytest.raises(dr.HostRead):
            with dr.HostReads(refuse=True):
                fn()
    with dr.HostReads(refuse=True):
        p = torch.tensor(0.5)
        assert bool(p > 0) and not bool(p >= 1)          # made here from a Python number
        jk.pack_mask(torch.tensor([[-1, 0, 1]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32))

    m, pre = _prefilled("tiny_moe", grouped=False)      # the per-expert loop reads row counts
    rnd = dr.new_round(m.target, m.head, pre, 16, 4, 200)
    rnd.draft_step(True)
    rnd.verify_step(16)
    with pytest.raises(dr.HostRead, match="tolist"):
        with dr.HostReads(refuse=True):
            rnd.verify_step(16)


@pytest.mark.parametrize("size", ["tiny", "tiny_moe"])
def test_rounds_allocate_the_same_shapes(size, round_backend):
    """Two rounds (and two AR steps) run the same ops with the same output shapes, whatever was
    accepted: nothing data-dependent that a replayed graph would get wrong."""
    m, pre = _prefilled(size, budget=12)
    rnd = dr.new_round(m.target, m.head, pre, 12, 3, 200)
    ar = dr.ARStep(m.target, pre)
    records, accepts = [], []
    for _ in range(4):
        with dr.HostReads(record_ops=True) as rec:
            rnd.draft_step(True)
            accepts.append(rnd.verify_step(12).clone())
            ar()
        records.append(rec.ops)
    assert len(records[1]) > 100
    for later in records[2:]:
        assert later == records[1]
    assert any(kind.startswith("kernel:tree_attention") for kind, _ in records[1])


def test_stage_groups_cover_the_round(round_backend):
    """Every stage name the round uses has a group (a renamed stage fails here, not on the GPU),
    each group takes time, and their sum is the round."""
    m, pre = _prefilled("tiny")
    rnd = dr.new_round(m.target, m.head, pre, 16, 4, 200)
    names = []

    class Names:
        def __call__(self, name):
            names.append(name)
            return torch.autograd.profiler.record_function(name)
    rnd.stages = Names()
    rnd.draft_step(True)
    rnd.verify_step(16)
    assert set(names) <= set(dr.STAGE_GROUPS) and {dr.STAGE_GROUPS[n] for n in names} == set(dr.GROUPS)
    split = dr.StageGraphs(dr.new_round(m.target, m.head, pre, 16, 4, 200), 16, cuda=False)
    times = split.replay()
    assert list(times) == list(dr.GROUPS) and all(t > 0 for t in times.values())


def test_stage_graphs_capture_every_op_of_the_round(round_backend, monkeypatch):
    """The CUDA path of StageGraphs with a fake torch.cuda: after its eager warm-up round, every op
    of the round runs while one of the three graphs is being captured (none falls between two
    captures, where a real capture would miss it), in the order draft, verify, accept_commit."""
    import contextlib
    from torch.utils._python_dispatch import TorchDispatchMode

    state = {"open": None, "log": []}

    class FakeGraph:
        def capture_begin(self, pool=None):
            assert state["open"] is None
            state["open"] = self

        def capture_end(self):
            state["open"] = None

    class FakeStream:
        def wait_stream(self, other):
            pass

        def synchronize(self):
            state["log"].append("sync")

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            state["log"].append(state["open"])
            return func(*args, **(kwargs or {}))

    for name, value in (("CUDAGraph", FakeGraph), ("graph_pool_handle", lambda: None),
                        ("Stream", FakeStream), ("current_stream", FakeStream),
                        ("stream", lambda s: contextlib.nullcontext()), ("synchronize", lambda *a: None)):
        monkeypatch.setattr(torch.cuda, name, value)
    m, pre = _prefilled("tiny")
    with Log():
        split = dr.StageGraphs(dr.new_round(m.target, m.head, pre, 16, 4, 200), 16, cuda=True)
    log = state["log"]
    captured = log[log.index("sync") + 1:]
    assert len(captured) > 50 and None not in captured
    assert list(split.graphs) == list(dr.GROUPS)
    order = list(dict.fromkeys(captured))
    assert order == [split.graphs[g] for g in dr.GROUPS]


def _stage_ops(layers):
    """The ops HostReads records (backend kernels as ``kernel:<fn>``) of a round's draft step, its
    verify and accept-commit steps, the verify forward alone and an AR step, on tiny models of
    ``layers`` layers (target and head)."""
    tc = tiny_qwen3_config(num_hidden_layers=layers)
    target = Qwen3(tc, random_qwen3_weights(tc))
    hc = tiny_draft_config(tc, num_hidden_layers=layers, block_size=5, target_layer_ids=[0])
    head = DraftHead(hc, random_draft_weights(hc))
    tokens = torch.randint(0, tc.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    pre = dr.prefill(target, head, tokens, dr.capacity(12, 4, 16, 5), 12, lambda f: dr.wall(f, False))
    rnd = dr.new_round(target, head, pre, 16, 4, 100)
    rnd.draft_step(True)
    rnd.verify_step(16)
    with dr.HostReads(record_ops=True) as rec:
        rnd.draft_step(True)
        n_draft = len(rec.ops)
        rnd.verify_step(16)
    with dr.HostReads(record_ops=True) as fwd:
        target.verify(rnd.tree, rnd.prefix, pre.cache, taps=head.target_layer_ids, fused_argmax=True)
    ar = dr.ARStep(target, pre)
    with dr.HostReads(record_ops=True) as step:
        ar()
    return rec.ops[:n_draft], rec.ops[n_draft:], fwd.ops, step.ops


def _counts(layers):
    draft, after, fwd, step = _stage_ops(layers)
    verify = dr.kernel_launches(fwd)
    accept = dr.kernel_launches(after) - verify
    return dr.kernel_launches(draft), verify, accept, dr.kernel_launches(step)


def test_norm_calls_and_their_torch_form(round_backend):
    """What the predictions add while auto runs rms_norm as torch ops (decode_costs.launches):
    the rms_norm calls per layer and per stage (NORM_CALLS: plain, with the residual add),
    recounted on models of one and two layers, and the torch form's launches in bf16
    (TORCH_NORM_LAUNCHES, one more with the residual add)."""
    def norms(ops):
        calls = [len(shapes) for name, shapes in ops if name == "kernel:rms_norm"]
        return calls.count(1), calls.count(2)            # (out) or (out, total)

    def stages(layers):
        draft, after, fwd, step = _stage_ops(layers)
        v, a = norms(fwd), norms(after)
        return [norms(draft), v, (a[0] - v[0], a[1] - v[1]), norms(step)]

    one, two = stages(1), stages(2)
    per = [tuple(b - a for a, b in zip(x, y)) for x, y in zip(one, two)]
    fixed = [tuple(a - p for a, p in zip(x, q)) for x, q in zip(one, per)]
    calls = dc.NORM_CALLS
    tapped_verify = tuple(a + b for a, b in zip(calls["verify_fixed"], calls["tap"]))  # one tap
    assert per == [calls["head_layer"], calls["target_layer"], (0, 0), calls["target_layer"]]
    assert fixed == [calls["draft_fixed"], tapped_verify, calls["accept_commit_fixed"],
                     calls["ar_fixed"]]

    from jetspec_kernels.ops import _reference     # the reference backend: the models' torch ops
    x, r = torch.randn(4, 64).bfloat16(), torch.randn(4, 64).bfloat16()
    w = torch.ones(64).bfloat16()
    with dr.HostReads(record_ops=True) as plain:
        _reference.rms_norm(x, None, w, 1e-6)
    with dr.HostReads(record_ops=True) as added:
        _reference.rms_norm(x, r, w, 1e-6)
    assert dr.kernel_launches(plain.ops) == dc.TORCH_NORM_LAUNCHES
    assert dr.kernel_launches(added.ops) == dc.TORCH_NORM_LAUNCHES + 1


def test_silu_mul_calls(round_backend):
    """One silu_mul call a layer, target and head (decode_costs.SILU_MUL_CALLS), none elsewhere;
    its torch form (the reference backend's) is silu and the product."""
    def per_stage(layers):
        return [sum(name == "kernel:silu_mul" for name, _ in ops) for ops in _stage_ops(layers)]
    one, two = per_stage(1), per_stage(2)
    calls = dc.SILU_MUL_CALLS
    # draft, verify + accept, verify forward, AR step: per layer, and nothing fixed
    assert [b - a for a, b in zip(one, two)] == [calls["head_layer"], calls["target_layer"],
                                                 calls["target_layer"], calls["target_layer"]]
    assert one == [calls["head_layer"], calls["target_layer"], calls["target_layer"],
                   calls["target_layer"]]
    from jetspec_kernels import python_ref as ref
    x = torch.randn(3, 8).bfloat16()
    with dr.HostReads(record_ops=True) as rec:
        ref.silu_mul(x, torch.bfloat16)
    assert dr.kernel_launches(rec.ops) == dc.TORCH_SILU_MUL_LAUNCHES


def test_launch_counts(round_backend):
    """The launch counts behind the predictions (decode_costs.LAUNCHES), recounted on models of
    one and two layers (target and head): per layer and fixed, within a quarter (update LAUNCHES
    and the predictions in docs/perf/decode_round.md when this fails)."""
    one, two = _counts(1), _counts(2)
    per = [b - a for a, b in zip(one, two)]
    fixed = [a - p for a, p in zip(one, per)]
    L = dc.LAUNCHES
    want_per = [L["head_layer"], L["target_layer"], L["head_append_layer"], L["target_layer"]]
    argmax = dc.argmax_launches(1, 100, 4)                         # one pass on the tiny models
    want_fixed = [L["draft_fixed"], L["verify_fixed"] + L["tap"] + argmax, L["accept_commit_fixed"],
                  L["ar_fixed"]]                                   # the head taps one layer
    for got, want in zip(per + fixed, want_per + want_fixed):
        assert abs(got - want) <= max(2, want // 4), (per, fixed)


def test_emit_launches():
    """TokenBuffer.emit (a round's emit, inside its graph) launches seven kernels without EOS
    ids: compare, add, where, scatter, count, the max_new test, done."""
    from jetspec_kernels.decode.output import TokenBuffer
    out = TokenBuffer(3, 20, 4, None, "cpu")
    emitted = torch.ones(3, 4, dtype=torch.int32)
    counts = torch.tensor([4, 0, 2], dtype=torch.int32)
    with dr.HostReads(record_ops=True) as rec:
        out.emit(emitted, counts)
    assert dr.kernel_launches(rec.ops) == 7, rec.ops
    assert out.count.tolist() == [4, 0, 2]


@pytest.mark.parametrize("vocab,min_chunk,cap,chunks", [(1000, 1000, 1 << 20, 1), (1000, 256, 0, 4),
                                                     (2816, 256, 0, 11)])
def test_argmax_launches(monkeypatch, vocab, min_chunk, cap, chunks):
    """decode_costs.argmax_launches (one pass: 3; n chunks: 2n + 4) is what Qwen3.argmax
    launches, recounted in one pass and in 4 and 11 chunks."""
    from jetspec_kernels import launch_plan
    monkeypatch.setattr(launch_plan, "ARGMAX_MIN_CHUNK", min_chunk)
    monkeypatch.setattr(launch_plan, "ARGMAX_CHUNK_BYTES", cap)
    assert -(-vocab // launch_plan.argmax_chunk(10, vocab, 4)) == chunks
    tc = tiny_qwen3_config(vocab_size=vocab, num_hidden_layers=1)
    target = Qwen3(tc, random_qwen3_weights(tc))
    hidden = torch.randn(2, 5, tc.hidden_size)
    with dr.HostReads(record_ops=True) as rec:
        target.argmax(hidden)
    assert dr.kernel_launches(rec.ops) == dc.argmax_launches(10, vocab, 4) == (
        3 if chunks == 1 else 2 * chunks + 4), rec.ops


def test_floors_against_hand_computed_values():
    """Qwen3-8B shapes, bf16, H200 ceilings (4.3 TB/s). Weights per target layer: q, o 4096^2,
    k, v 1024 x 4096, gate/up/down 12288 x 4096 = 192,937,984; 36 layers 6,945,767,424; lm_head
    151936 x 4096 = 622,329,856. KV per position: 2 x 36 x 8 x 128 x 2 B = 147,456 (head:
    2 x 5 x 8 x 128 x 2 = 20,480). B1, prompt 512, budget 64:
      draft  (5 x 192,937,984 + 622,329,856) x 2 + (512 + 32) x 20,480 B = 3,185,180,672 B
      verify (6,945,767,424 + 622,329,856) x 2 + (512 + 64 + 64) x 147,456 B = 15,230,566,400 B
      accept (83,886,080 + 5 x 8,388,608) x 2 + 2 x 16 x 147,456 + 16 x 20,480 B = 256,704,512 B
      AR     15,136,194,560 + (513 + 1) x 147,456 B = 15,211,986,944 B
    each memory-bound (FLOPs / 790e12 far below bytes / 4.3e12)."""
    m = dc.Model.of_size("8b")
    rc = dc.round_costs(m, 1, 512, 64)
    assert rc["draft"].nbytes == 3_185_180_672
    assert rc["verify"].nbytes == 15_230_566_400
    assert rc["accept_commit"].nbytes == 256_704_512
    assert dc.ar_step(m, 1, 512).nbytes == 15_211_986_944
    floor = sum(c.floor(dc.H200) for c in rc.values())
    assert floor == pytest.approx((3_185_180_672 + 15_230_566_400 + 256_704_512) / 4.3e12)
    assert dc.ar_step(m, 1, 512).floor(dc.H200) == pytest.approx(15_211_986_944 / 4.3e12)
    # B16, budget 256: the verify forward is compute-bound (2 x 7.57e9 x 4096 FLOPs and more)
    big = dc.round_costs(m, 16, 512, 256)["verify"]
    assert big.flops / dc.H200.flops > big.nbytes / dc.H200.bandwidth
    assert big.flops > 2 * (6_945_767_424 + 622_329_856) * 4096
    # MoE: one token reads k experts per sparse layer, a long prompt every expert
    moe = dc.Model.of_size("30b_a3b")
    assert moe.touched_experts(1) == pytest.approx(8) and moe.touched_experts(10 ** 5) == pytest.approx(128)


@pytest.mark.parametrize("size,batch,prompt,budget,cap,total", [
    # 8b: weights 9,239,003,136 params x 2 = 18,478,006,272 B; a row of activations
    # (3 H + 2 H fp32 + 2 (32 + 8) 128 + 4 x 12288 + 5 H taps) x 2 B = 217,088 B.
    # B1 p512: kv 1000 x 147,456 + head kv 1000 x 20,480; prefill chunk 512 rows x 217,088 =
    # 111,149,056 > round 2 x 64 x (217,088 + 2 x 151936 x 2) = 105,578,496 (the argmax in one
    # pass); slack 2 GiB.
    ("8b", 1, 512, 64, 1000, 20_904_574_976),
    # B16 p8192 n256: kv 16 x 9000 x 147,456 = 21,233,664,000, head kv 2,949,120,000; round
    # 2 x 4096 x (217,088 + 2 x 30464 x 2) = 2,776,629,248 (argmax chunks of 30464 columns) >
    # prefill 16 x 512 x 217,088 = 1,778,384,896.
    ("8b", 16, 8192, 256, 9000, 47_584_903_168),
    # 30b_a3b: weights 30,835,998,720 params x 2; kv per position 2 x 48 x 4 x 128 x 2 = 98,304,
    # head 10,240; a row (3 H + 2 H fp32 + 2 (32 + 4) 128 + 8 (2 H + 4 x 768) + 64 + 5 H) x 2 B
    # = 182,400; prefill 16 x 512 x 182,400 = 1,494,220,800 > round 641,978,368.
    ("30b_a3b", 16, 8192, 64, 9000, 80_944_037_888),
])
def test_memory_estimator_table(size, batch, prompt, budget, cap, total):
    m = dc.Model.of_size(size)
    assert dc.memory(m, batch, prompt, budget, cap, 512)["total"] == total


def test_plan_and_predicted_device_time(tmp_path, capsys):
    """The GPU plan starts with the issue's headline config; the dense plan's first call covers
    at least every prompt-512 config within the decode step's limit in device_check.sh, and the
    rest of it plus the MoE plan fit one more call of under 8 minutes (warm Triton cache: no
    compilation)."""
    from test_device_check import step_limits

    args = bd.parser().parse_args([])
    size, plan, chunk = bd.plan(args, cuda=True)
    assert size == "8b" and plan[0] == dc.Config(1, 512, 64) and len(plan) == 18
    m = dc.Model.of_size(size)
    cum = dc.plan_seconds(m, plan, dc.H200, chunk)
    limit = step_limits()["decode"]
    done = sum(t <= limit for t in cum)
    assert done >= 9 and all(c.prompt == 512 for c in plan[:9]), (limit, cum)
    compile_s = dc.COMPILE_FIRST_S + (len(plan) - 1) * dc.COMPILE_NEW_SHAPE_S
    rest = cum[-1] - cum[done - 1] - (len(plan) - done) * dc.COMPILE_NEW_SHAPE_S
    moe_args = bd.parser().parse_args(["--model", "moe"])
    moe_size, moe_plan, _ = bd.plan(moe_args, cuda=True)
    moe_s = dc.plan_seconds(dc.Model.of_size(moe_size), moe_plan, dc.H200, chunk)[-1]
    assert rest + moe_s < 8 * 60 - 60, (rest, moe_s, compile_s)
    # --predict prints the GPU plan's tables without a device
    assert bd.main(["--predict", "--device", "cpu", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "8b on H200" in out and "8b on H100" in out and "| B1/p512/n64 |" in out


def test_quick_cpu_run_resume_and_missing_models(tmp_path, capsys):
    """The CPU quick run: spec rows with the stage split, one host read per round, the AR and
    prefill rows, floors and predictions; --resume keeps finished groups; a missing checkpoint
    directory exits 2."""
    out = tmp_path / "a"
    assert bd.main(["--quick", "--device", "cpu", "--no-plot", "--out", str(out)]) == 0
    with open(out / "decode.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    kinds = [r["backend"] for r in rows]
    assert kinds == ["prefill", "ar", "spec", "spec"] and all(r["status"] == "ok" for r in rows)
    for r in rows[2:]:
        assert float(r["host_syncs_per_round"]) == 1.0
        parts = [float(r[f"{g}_ms"]) for g in dr.GROUPS]
        assert all(p > 0 for p in parts) and float(r["split_sum_ms"]) == pytest.approx(sum(parts))
        assert float(r["floor_ms"]) > 0 and float(r["pred_ms"]) > float(r["floor_ms"])
        assert float(r["tokens_per_round"]) >= 1.0 and float(r["ar_tok_s"]) > 0
    assert float(rows[1]["median_us"]) > 0 and float(rows[0]["median_us"]) > 0

    again = tmp_path / "b"
    assert bd.main(["--quick", "--device", "cpu", "--no-plot", "--out", str(again),
                    "--resume", str(out / "decode.csv")]) == 0
    with open(again / "decode.csv", newline="") as f:
        kept = list(csv.DictReader(f))
    assert [(r["shape"], r["backend"], r["median_us"]) for r in kept] == \
        [(r["shape"], r["backend"], r["median_us"]) for r in rows]
    assert bd.main(["--quick", "--device", "cpu", "--target", str(tmp_path / "none"),
                    "--out", str(tmp_path / "c")]) == 2
    assert math.isfinite(float(rows[2]["floor_ms"]))


def test_exact_rounds(tmp_path, capsys):
    """--exact: the target in the exact mode (triton under the interpreter here), rows labelled
    :exact, still one host read per round; a backend without an exact form exits 2 naming it."""
    out = tmp_path / "x"
    assert bd.main(["--quick", "--device", "cpu", "--no-plot", "--exact", "--fused-ops-backend",
                    "triton", "--out", str(out)]) == 0
    with open(out / "decode.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["backend"] for r in rows] == ["prefill:exact", "ar:exact", "spec:exact", "spec:exact"]
    assert all(r["status"] == "ok" for r in rows)
    assert all(float(r["host_syncs_per_round"]) == 1.0 for r in rows[2:])
    capsys.readouterr()
    assert bd.main(["--quick", "--device", "cpu", "--no-plot", "--exact", "--fused-ops-backend",
                    "cuda", "--out", str(tmp_path / "y")]) == 2
    assert "--exact: exact mode: bench_decode --exact on the 'cuda' backend" in capsys.readouterr().err
    assert bd.main(["--quick", "--device", "cpu", "--no-plot", "--exact-tile", "wide",
                    "--out", str(tmp_path / "z")]) == 2
    assert "--exact-tile needs --exact" in capsys.readouterr().err


def test_exact_on_a_backend_this_machine_cannot_run(tmp_path, monkeypatch, capsys):
    """--exact with triton where it cannot run (CPU tensors without the interpreter): a run exits 2
    naming why, --predict still prints the predictions (it runs nothing)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    argv = ["--quick", "--device", "cpu", "--no-plot", "--exact", "--backends", "triton",
            "--out", str(tmp_path / "x")]
    assert bd.main(argv) == 2
    assert "--exact: exact mode: bench_decode --exact on the 'triton' backend is not available" \
        in capsys.readouterr().err
    assert bd.main(argv + ["--predict"]) == 0


def test_exact_rounds_wide_tile(tmp_path, monkeypatch):
    """--exact-tile wide: the target runs the wide GEMM tile (every exact GEMM call sees it),
    rows labelled :exact-wide."""
    from jetspec_kernels.triton import exact_matmul
    seen = []
    real = exact_matmul.exact_linear
    monkeypatch.setattr(exact_matmul, "exact_linear",
                        lambda x, w, tile="narrow", **kw: seen.append(tile) or real(x, w, tile, **kw))
    out = tmp_path / "x"
    assert bd.main(["--quick", "--device", "cpu", "--no-plot", "--exact", "--exact-tile", "wide",
                    "--fused-ops-backend", "triton", "--out", str(out)]) == 0
    with open(out / "decode.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["backend"] for r in rows] == ["prefill:exact-wide", "ar:exact-wide",
                                            "spec:exact-wide", "spec:exact-wide"]
    assert all(r["status"] == "ok" for r in rows)
    assert seen and set(seen) == {"wide"}


def test_exact_rounds_k_parts(tmp_path, monkeypatch, capsys):
    """--exact-k-parts 4: the target's row-parallel GEMMs run 4 K parts (the tp-invariant mode),
    rows labelled :exact-k4; a value the target refuses, or the flag without --exact, exits 2."""
    from jetspec_kernels.ops import exact as ex
    seen = []
    real = ex.linear
    monkeypatch.setattr(ex, "linear", lambda x, w, **kw: seen.append(kw.get("parts", 1))
                        or real(x, w, **kw))
    out = tmp_path / "x"
    assert bd.main(["--quick", "--device", "cpu", "--no-plot", "--exact", "--exact-k-parts", "4",
                    "--out", str(out)]) == 0
    with open(out / "decode.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["backend"] for r in rows] == ["prefill:exact-k4", "ar:exact-k4", "spec:exact-k4",
                                            "spec:exact-k4"]
    assert all(r["status"] == "ok" for r in rows)
    assert set(seen) == {1, 4}
    capsys.readouterr()
    for argv, err in ((["--exact", "--exact-k-parts", "3"], "--exact-k-parts: exact_k_parts must be"),
                      (["--exact-k-parts", "4"], "--exact-k-parts needs --exact")):
        assert bd.main(["--quick", "--device", "cpu", "--no-plot", "--out", str(tmp_path / "y")]
                       + argv) == 2
        assert err in capsys.readouterr().err


def test_models_that_do_not_fit_are_skipped_with_a_row(tmp_path, monkeypatch):
    """On a GPU whose free memory cannot hold the weights (the MoE target on an H100), every
    config gets a skip row saying how much it needs, and the run succeeds (a fake CUDA device)."""
    from bench import common as bc
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (50e9, 80e9))
    monkeypatch.setattr(bc, "device_name", lambda dev: "fake_gpu")
    monkeypatch.setattr(bc, "measure_ceilings", lambda *a: bc.Ceilings(3e12, 8e14, "bf16", None, None))
    assert bd.main(["--model", "moe", "--device", "cuda", "--no-plot", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "decode.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12 and all(r["status"] == "skip" for r in rows)
    assert rows[0]["note"] == "the 30b_a3b weights need about 63.8 GB, 50.0 GB free"
