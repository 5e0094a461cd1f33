"""Every bench runs in --quick mode on the CPU and produces its table, CSV and PNG; the baselines
the benches compare against compute what the reference computes."""
import csv
import importlib
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is a top-level package of the checkout, not installed
    sys.path.insert(0, str(ROOT))

import jetspec_kernels as jk  # noqa: E402
from jetspec_kernels import python_ref as ref  # noqa: E402
from bench import common as bc  # noqa: E402
# bench_decode has its own tests (tests/test_bench_decode.py): its rows are rounds, not ops.
BENCHES = ["tree_attention", "draft_tree", "verify", "draft_head"]
NUMERIC = ["median_us", "tflops", "gbps", "floor_us", "time_over_floor", "flops", "bytes"]


@pytest.mark.parametrize("name", BENCHES)
def test_quick_bench_writes_table_csv_png(name, tmp_path, capsys):
    mod = importlib.import_module(f"bench.bench_{name}")
    assert mod.main(["--quick", "--device", "cpu", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"== {name} on cpu-" in out
    assert "median_us" in out and "time_over_floor" in out

    with open(tmp_path / f"{name}.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        header = reader.fieldnames
    expected = bc.CORE_COLUMNS + [f"x_{b}" for b in mod.BASELINES]
    assert header[:len(expected)] == expected and header[-1] == "note"
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok, "no row was measured"
    for r in ok:
        for col in NUMERIC:
            assert math.isfinite(float(r[col])), (r["shape"], r["backend"], col, r[col])
        assert float(r["median_us"]) > 0 and float(r["time_over_floor"]) > 0
    for r in rows:
        assert r["status"] in ("ok", "skip", "error")
        if r["status"] != "ok":
            assert r["note"], f"{r['backend']} at {r['shape']} is {r['status']} without a reason"
    # The reference backend runs every op on the CPU, and is compared to a baseline.
    ours = [r for r in ok if r["backend"] not in mod.BASELINES
            and "reference" in r["backend"] + r["shape"]]
    assert ours
    assert any(math.isfinite(float(r[f"x_{b}"])) for r in ours for b in mod.BASELINES if r[f"x_{b}"])
    png = (tmp_path / f"{name}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_runs_as_a_script(tmp_path, capsys):
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_draft_tree.py"), "--quick",
                          "--device", "cpu", "--no-plot", "--backends", "reference",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "draft_tree.csv").exists() and not (tmp_path / "draft_tree.png").exists()

    # The device-check summary reads that CSV and a step log.
    from bench import summarize

    (tmp_path / "steps.tsv").write_text("build\tPASS\t12\t_C built for 90a\n")
    summarize.main(["--steps", str(tmp_path / "steps.tsv"), "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert "build" in out and "PASS" in out and "reference:topn" in out and "x_host=" in out


def test_draft_tree_bench_hidden_methods(tmp_path, capsys, monkeypatch):
    """The fused-against-gemm measurement (device_check's hidden_topk step, on the CPU):
    --groups keeps the from_hidden rows, --batches sets the shapes, and each backend has a
    method="gemm" row beside its fused ones (a skip row where it has no fused kernel); bad
    values are refused naming the option."""
    mod = importlib.import_module("bench.bench_draft_tree")
    assert mod.main(["--quick", "--device", "cpu", "--no-plot", "--backends", "reference",
                     "--groups", "from_hidden", "--batches", "1,3", "--algorithms", "topn",
                     "--out", str(tmp_path)]) == 0
    with open(tmp_path / "draft_tree.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["shape"], r["backend"], r["status"]) for r in rows] == [
        (f"{b}x4x2048/k4/n16/from_hidden", backend, "ok") for b in (1, 3)
        for backend in ("host", "torch_vec", "reference:topn", "reference:gemm")]
    # A backend without a fused hidden_topk (the cuda one) gets a skip row naming its gemm row.
    import jetspec_kernels.backend as bk
    monkeypatch.setattr(bk, "implements", lambda name, fn: fn != "hidden_topk")
    assert mod.main(["--quick", "--device", "cpu", "--no-plot", "--backends", "reference",
                     "--groups", "from_hidden", "--batches", "1", "--algorithms", "topn",
                     "--out", str(tmp_path)]) == 0
    with open(tmp_path / "draft_tree.csv", newline="") as f:
        rows = {r["backend"]: r for r in csv.DictReader(f)}
    assert rows["reference:topn"]["status"] == "skip" and rows["reference:gemm"]["status"] == "ok"
    assert "its path is reference:gemm" in rows["reference:topn"]["note"]
    for argv, message in ((["--groups", "logits,hidden"], "argument --groups: 'hidden' is not"),
                          (["--batches", "1,0"], "argument --batches: must be an int >= 1, got 0"),
                          (["--batches", ","], "argument --batches: must be a comma list")):
        with pytest.raises(SystemExit):
            mod.main(["--device", "cpu", *argv])
        assert message in capsys.readouterr().err


def test_device_check_script_parses():
    res = subprocess.run(["bash", "-n", str(ROOT / "bench" / "device_check.sh")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_roofline_floor_and_speedups(tmp_path):
    ceil = bc.Ceilings(bandwidth=1e12, flops=1e14, flops_dtype="bf16", datasheet_bandwidth=None,
                       datasheet_flops=None)
    assert ceil.floor_s(1e11, 1e9) == pytest.approx(1e-3)      # compute-bound
    assert ceil.floor_s(1e9, 1e10) == pytest.approx(1e-2)      # memory-bound
    opts = bc.Options(quick=True, device=torch.device("cpu"), out=tmp_path, backends=["reference"],
                      plot=False, args=None)
    t = bc.Table("unit", opts, ceil, ["base"])
    t.add("s", "base", 4e-3, flops=1e11, nbytes=1e9)
    t.add("s", "fast", 2e-3, flops=1e11, nbytes=1e9)
    t.skip("s", "missing", "not built")
    t.finish()
    fast = t.rows[1]
    assert fast["x_base"] == pytest.approx(2.0)
    assert fast["time_over_floor"] == pytest.approx(2.0)
    assert fast["tflops"] == pytest.approx(50.0) and fast["gbps"] == pytest.approx(500.0)
    assert math.isnan(t.rows[2]["median_us"]) and t.rows[2]["status"] == "skip"


def test_graphs_option_times_cuda_calls_from_a_graph(tmp_path, monkeypatch):
    """--graphs: ignored on the CPU (same table name); on CUDA every Table row is timed by
    triton.testing.do_bench_cudagraph and the table is written as <bench>_graphs.csv."""
    import triton.testing

    p = bc.parser("unit")
    cpu = bc.options(p, ["--graphs", "--device", "cpu", "--out", str(tmp_path)])
    assert not cpu.graphs and bc.Table("unit", cpu, None, []).bench == "unit"
    calls = []

    def fake(fn, rep=20, return_mode="mean", **kw):
        calls.append((rep, return_mode))
        fn()
        return 0.5                                   # ms

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", fake)
    monkeypatch.setattr(bc, "device_name", lambda dev: "fake_gpu")     # no CUDA on this machine
    gpu = bc.Options(quick=True, device=torch.device("cuda"), out=tmp_path, backends=["cuda"],
                     plot=False, args=None, graphs=True)
    ceil = bc.Ceilings(bandwidth=1e12, flops=1e14, flops_dtype="bf16", datasheet_bandwidth=None,
                       datasheet_flops=None)
    t = bc.Table("unit", gpu, ceil, [])
    ran = []
    row = t.run("s", "cuda", lambda: ran.append(1), flops=1e9, nbytes=1e6)
    assert calls == [(10, "median")] and ran == [1]
    assert row["status"] == "ok" and row["median_us"] == pytest.approx(500.0)
    assert t.bench == "unit_graphs" and "CUDA graph" in t.render()
    assert bc.time_fn(lambda: None, torch.device("cpu"), graph=True, reps=1) >= 0  # CPU: ignored
    assert len(calls) == 1


def test_tree_baselines_match_reference():
    from bench.bench_draft_tree import host_tree_from_topk, vec_tree_from_topk

    gen = torch.Generator().manual_seed(3)
    for budget in (7, 20, 33):
        logits = torch.randn(2, 5, 40, generator=gen) * 3
        tk, lp = ref.log_softmax_topk(logits, 3)
        root = torch.randint(0, 40, (2,), generator=gen)
        for alg, fn in (("topn", vec_tree_from_topk), ("accum_logp", host_tree_from_topk)):
            want = ref.build_tree(tk, lp, root, budget, alg)
            tok, par, _, mask = fn(lp, tk.long(), root, budget)
            for b in range(2):
                n = int(want["num_nodes"][b])
                assert _paths(want["tokens"][b], want["parents"][b], n) == _paths(tok[b], par[b], n)
                dense = ref.dense_mask(par[b:b + 1], torch.tensor([n]))[0].bool()
                assert torch.equal(dense[:n, :n], mask[b, :n, :n])


def _paths(tokens, parents, n):
    out = set()
    for i in range(n):
        p, j = [], i
        while j >= 0:
            p.append(int(tokens[j]))
            j = int(parents[j])
        out.add(tuple(p))
    return out


def test_verify_stage_baselines_match_reference():
    from bench.bench_verify import (eager_commit, eager_rope_append, host_verify, target_logits,
                                    vec_verify)

    gen = torch.Generator().manual_seed(5)
    tree = bc.random_tree(3, 24, torch.device("cpu"), seed=2)
    logits = target_logits(tree, 300, torch.float32, gen)
    want = jk.verify_tree(tree, logits, backend="reference")
    assert int(want.accept_len.max()) > 0
    assert torch.equal(host_verify(tree, logits, 0.0), want.emitted.long())
    acc, emitted = vec_verify(tree, logits, 0.0)
    assert torch.equal(emitted, want.emitted.long()) and torch.equal(acc, want.accept_len.long())

    prefix = torch.full((3,), 40, dtype=torch.int32)
    kc = torch.randn(3, 64, 2, 8, generator=gen)
    vc = torch.randn_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    res = jk.commit_kv(kc, vc, prefix, want, backend="reference")
    assert torch.equal(eager_commit(kc2, vc2, prefix, want.path), res.prefix_lens)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)

    q, k, v = (torch.randn(3, 24, h, 8, generator=gen) for h in (4, 2, 2))
    qw, kw = torch.rand(8, generator=gen) + 0.5, torch.rand(8, generator=gen) + 0.5
    pos = tree.positions(prefix)
    kc2, vc2 = kc.clone(), vc.clone()
    q_ref = jk.qk_norm_rope_append(q, k, v, qw, kw, pos, kc, vc, rope_theta=1e4, cache_start=prefix,
                                   backend="reference")
    q_eager = eager_rope_append(q, k, v, qw, kw, pos, kc2, vc2, 1e4, 1e-6, prefix)
    assert float((q_eager - q_ref).norm() / q_ref.norm()) < 1e-5
    assert float((kc2 - kc).norm() / kc.norm()) < 1e-5 and torch.equal(vc2, vc)


def test_filtered_sampling_baseline_draws_what_the_filters_keep():
    """bench_verify's top-k / top-p baseline (torch.topk, then a cumulative sum) draws from the
    set python_ref.filter_keep keeps, every member of it, in about its renormalised
    proportions; top-k 1 is the argmax."""
    from bench.bench_verify import _target_tokens
    from jetspec_kernels.python_ref.sampling import filter_keep

    gen = torch.Generator().manual_seed(8)
    row = torch.randn(40, generator=gen) * 2
    logits = row.expand(1, 4000, 40).contiguous()     # 4000 draws from one row
    for k, p in ((5, None), (8, 0.7), (40, 0.5), (1, 0.9)):
        draws = _target_tokens(logits, 1.0, k, p, gen=gen)[0]
        keep = filter_keep(row[None, None], torch.tensor([k]),
                           None if p is None else torch.tensor([p]))[0, 0]
        probs = torch.where(keep, torch.softmax(row, -1), torch.zeros(()))
        probs /= probs.sum()
        freq = torch.bincount(draws, minlength=40).float() / draws.numel()
        assert set(draws.tolist()) == set(keep.nonzero()[:, 0].tolist()), (k, p)
        assert float((freq - probs).abs().max()) < 0.03, (k, p)
    assert torch.equal(_target_tokens(logits, 1.0, 1, None, gen=gen), logits.argmax(-1))


def test_profile_kernels_smoke_and_ncu_summary(tmp_path, capsys):
    """The ncu driver runs every op (small, reference backend on the CPU), and its summariser
    reads ncu's CSV layout; summarize.py appends the ncu lines and skips ncu's CSV as a bench."""
    from bench import profile_kernels, summarize

    assert profile_kernels.main(["--device", "cpu", "--small"]) == 0
    out = capsys.readouterr().out
    assert out.count("profile: ") == 9 and "FAILED" not in out
    head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
            '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
            '"Metric Value"\n')
    name = '"void jetspec::tree_attention_wgmma_kernel<__nv_bfloat16, 128>(jetspec::AttnParams)"'
    row = '"0","1","py","h",{},"1","7","(128, 1, 1)","(4, 8, 1)","0","9.0","SOL","{}","{}","{}"\n'
    (tmp_path / "ncu_profile.csv").write_text(
        "==PROF== Connected\n" + head + row.format(name, "Duration", "us", "9.41")
        + row.format(name, "Compute (SM) Throughput", "%", "51.2"))
    profile_kernels.main(["--summarize", str(tmp_path / "ncu_profile.csv")])
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith("0 | jetspec::tree_attention_wgmma_kernel | 9.41 us | 51.2 % | -")
    (tmp_path / "ncu_summary.txt").write_text(line + "\n")
    (tmp_path / "steps.tsv").write_text("ncu_profile\tPASS\t40\t\n")
    summarize.main(["--steps", str(tmp_path / "steps.tsv"), "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert "Nsight Compute" in out and line in out and "ncu_profile.csv" not in out


def test_hardware_record_from_a_gpu_run(tmp_path):
    """The per-test record a GPU run writes (JETSPEC_HW_RECORD) becomes rows of
    jetspec_kernels/hardware_record.json: one per op x backend x dtype with device, date, commit
    and files, FAILED when any of its tests failed, and per op the GPU backends whose every row
    passed."""
    import json
    from bench import hardware_record as hr
    ops = "tests/test_cuda_ops.py"
    def e(test, outcome, file=ops, **params):
        return {"nodeid": f"{file}::{test}", "file": file, "test": test,
                "params": {k: str(v) for k, v in params.items()}, "outcome": outcome}
    entries = [
        e("test_tree_attention", "passed", dev="cuda", dtype=torch.bfloat16, kernel="auto"),
        e("test_tree_attention", "failed", dev="cuda", dtype=torch.float16, kernel="tma"),
        e("test_kv_only_norm_rope_append", "passed", dev="cuda", dtype=torch.float16),
        e("test_qk_norm_rope_append", "passed", dev="cuda", dtype=torch.bfloat16),
        e("test_verify_tree", "failed", dev="cuda", dtype=torch.float32),
        e("test_verify_tree_walk_limit", "passed", dev="cuda"),
        e("test_pack_mask", "skipped", dev="cuda"),
        e("test_rope_matches_reference", "passed", file="tests/test_triton_rope.py", dtype=torch.float32),
        # the cuda backend's hidden-state top-K is its GEMM method (no fused hidden_topk): filed
        # under hidden_topk, never a candidate for it
        e("test_cuda_hidden_topk_qwen3_shape", "passed", file="tests/ops/test_draft_tree.py",
          backend="cuda"),
    ]
    rows = hr.aggregate(entries)
    assert hr.status(rows[("hidden_topk", "cuda", "-")]) == "passed"
    assert hr.classify(entries[1]) == ("tree_attention", "cuda kernel=tma", ["fp16"])
    assert hr.status(rows[("tree_attention", "cuda", "bf16")]) == "passed"
    assert hr.status(rows[("tree_attention", "cuda kernel=tma", "fp16")]) == "FAILED (1 of 1)"
    assert hr.status(rows[("qk_norm_rope_append", "cuda", "bf16")]) == "passed"
    assert hr.status(rows[("qk_norm_rope_append", "cuda", "fp16")]) == "passed"
    assert hr.status(rows[("verify_tree", "cuda", "fp32")]) == "FAILED (1 of 1)"
    assert hr.status(rows[("verify_tree", "cuda", "-")]) == "passed"
    assert hr.status(rows[("pack_mask", "cuda", "-")]) == "not run"
    assert hr.verified(rows) == {"tree_attention": ["cuda"], "qk_norm_rope_append": ["cuda", "triton"]}
    new = hr.record_rows(rows, "NVIDIA H200", "2026-12-04", "abc1234", ["bench/results/NVIDIA_H200/"])
    assert new[0]["op"] == "tree_attention" and all(tuple(r) == hr.ROW_FIELDS for r in new)
    assert {"op": "qk_norm_rope_append", "backend": "cuda", "dtype": "fp16", "device": "NVIDIA H200",
            "status": "passed", "date": "2026-12-04", "commit": "abc1234",
            "files": ["bench/results/NVIDIA_H200/"]} in new
    assert {"op": "verify_tree", "backend": "cuda", "dtype": "fp32", "device": "NVIDIA H200",
            "status": "FAILED (1 of 1)", "date": "2026-12-04", "commit": "abc1234",
            "files": ["bench/results/NVIDIA_H200/"]} in new

    # --merge: a run's row replaces the row of the same op, backend, dtype and device (its note
    # with it), other rows stay where they were, new ones are appended, trusted is untouched
    old_row = {**new[0], "date": "2026-11-30", "commit": "0000000", "note": "older run"}
    other_device = {**new[0], "device": "NVIDIA H100"}
    before = {"about": "x", "trusted": {"pack_mask": {"backends": ["cuda"], "dtypes": ["-"]}},
              "rows": [other_device, old_row]}
    path = tmp_path / "hardware_record.json"
    path.write_text(hr.dumps(before))
    (tmp_path / "run.jsonl").write_text("".join(json.dumps(x) + "\n" for x in entries))
    assert hr.main([str(tmp_path / "run.jsonl"), "--device", "NVIDIA H200", "--date", "2026-12-04",
                    "--commit", "abc1234", "--files", "a.jsonl, b.log", "--merge", str(path)]) == 0
    after = json.loads(path.read_text())
    assert after["trusted"] == before["trusted"] and after["about"] == "x"
    assert after["rows"][0] == other_device
    assert after["rows"][1] == {**new[0], "files": ["a.jsonl", "b.log"]}
    assert [(r["op"], r["backend"], r["dtype"]) for r in after["rows"][1:]] == \
        [(r["op"], r["backend"], r["dtype"]) for r in new]
    assert hr.dumps(after) == path.read_text()
    with pytest.raises(ValueError, match="new_rows: a row lacks"):
        hr.merge(before, [{"op": "x"}])

    (tmp_path / "hw_record.jsonl").write_text("".join(json.dumps(x) + "\n" for x in entries))
    (tmp_path / "steps.tsv").write_text("gpu_tests\tFAIL(1)\t80\t2 failed, 4 passed\n")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "summarize.py"), "--steps",
                          str(tmp_path / "steps.tsv"), "--results", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "== hardware record" in out.stdout
    assert '{"op": "qk_norm_rope_append", "backend": "cuda", "dtype": "bf16"' in out.stdout
    assert "passed on this run, every dtype: qk_norm_rope_append: cuda, triton" in out.stdout
    assert "passed on this run, every dtype: verify_tree" not in out.stdout

    # tests/ops: the backend is a parameter, and the file names the op when the test does not.
    # (test, file, parameters) -> (op, backend, dtypes)
    ops_dir = "tests/ops/"
    cases = [
        (("test_matches_reference", ops_dir + "test_tree_attention.py",
          dict(backend="triton", dtype=torch.float16)), ("tree_attention", "triton", ["fp16"])),
        (("test_rms_norm_meets_the_contract", ops_dir + "test_rms_norm.py",
          dict(backend="triton", dtype=torch.bfloat16)), ("rms_norm", "triton", ["bf16"])),
        (("test_triton_two_pass_rows", ops_dir + "test_rms_norm.py", dict(backend="triton")),
         ("rms_norm", "triton", ["-"])),
        (("test_silu_mul_meets_the_contract", ops_dir + "test_silu_mul.py",
          dict(backend="sim", dtype=torch.bfloat16)), ("silu_mul", "sim", ["bf16"])),
        (("test_silu_mul_magnitudes_and_specials", ops_dir + "test_silu_mul.py",
          dict(backend="cuda", dtype=torch.float16)), ("silu_mul", "cuda", ["fp16"])),
        (("test_silu_mul_strided_and_leading_dims", ops_dir + "test_silu_mul.py",
          dict(backend="triton", dtype=torch.float32)), ("silu_mul", "triton", ["fp32"])),
        (("test_tree_attention", "tests/test_engine_layouts.py", dict(engine="triton")),
         ("tree_attention", "triton", ["-"])),
        (("test_graph_replay", ops_dir + "test_every_op.py", dict(backend="cuda")),
         ("other: test_graph_replay", "cuda", ["-"])),
        (("test_topn_steps_match_model", "tests/test_cuda_build_tree_steps.py",
          dict(backend="cuda")), ("other: test_topn_steps_match_model", "cuda", ["-"])),
    ]
    for (test, file, params), want in cases:
        assert hr.classify(e(test, "passed", file=file, **params)) == want, (test, file, params)


def test_conftest_writes_the_hardware_record(tmp_path):
    """tests/conftest.py appends one JSON line per test when JETSPEC_HW_RECORD is set."""
    import json
    import os
    record = tmp_path / "rec.jsonl"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_backend.py", "-k", "set_and_get or unknown_backend"],
                         capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "JETSPEC_HW_RECORD": str(record)})
    assert out.returncode == 0, out.stdout[-2000:]
    entries = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(x["test"] for x in entries) == ["test_set_and_get_backend",
                                                  "test_unknown_backend_names_the_argument"]
    assert all(x["outcome"] == "passed" and x["file"].endswith("test_backend.py") for x in entries)


def test_adaptive_budget_bench_quick(tmp_path, capsys):
    """bench_adaptive_budget --quick: measured rows for every configuration with identical greedy
    outputs, the batch-share and predicted rows, CSV and PNG."""
    from bench import bench_adaptive_budget as bab

    assert bab.main(["--quick", "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert "== adaptive_budget on cpu-" in capsys.readouterr().out
    with open(tmp_path / "adaptive_budget.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    parts = {r["part"] for r in rows}
    assert {"measured", "share", "predicted h200-8b roofline"} <= parts
    measured = [r for r in rows if r["part"] == "measured"]
    assert {(r["batch"], r["config"]) for r in measured} == {(b, c) for b in ("1", "2")
                                                             for c in ("4", "16", "auto")}
    assert all(float(r["tokens_per_s"]) > 0 and not r["note"] for r in measured)
    assert (tmp_path / "adaptive_budget.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_adaptive_budget_counterfactual_matches_a_real_decode():
    """The offline table's accepted length of the budget-n tree, read off a round decoded at a
    larger budget, is what decoding at budget n accepts in that round (the first round: both
    start from the same state)."""
    from bench import bench_adaptive_budget as bab
    from jetspec_kernels.decode import generate
    from jetspec_kernels.models.assets import load_tiny

    target, heads = load_tiny()
    head = heads["head_causal"]
    prompts, _ = bab._prompts(3, 48, seed=4)
    rec = bab.Recorder("cpu")
    with bc.using_backend("reference"):
        generate(target, head, prompts, max_new_tokens=2, budget=[64], cost_model={64: 1.0},
                 calibrator=rec)
        table = bab.counterfactual(rec.rounds[0])
        assert torch.equal(table[:, -1], rec.rounds[0].accept_len.long())
        assert bool((table[:, 1:] >= table[:, :-1]).all()) and int(table[:, -1].max()) >= 2
        for n in (2, 5, 16, 40):
            small = generate(target, head, prompts, max_new_tokens=2, budget=n)
            assert small.stats.accept_lengths[:3] == table[:, n - 1].tolist(), n


def test_adaptive_oracle_replay_is_exact_and_its_optimum_optimal(tmp_path, capsys):
    """bench/adaptive_oracle.py: replaying fixed sizes over the position table takes exactly the
    rounds real decodes take (batch 1 and batch 2), the dynamic-programming optimum equals a brute
    force over every sequence of sizes and beats no fixed size by less than zero, and --quick
    writes its rows."""
    from bench import adaptive_oracle as ao
    from jetspec_kernels.decode import generate
    from jetspec_kernels.models.assets import load_tiny

    target, heads = load_tiny()
    head = heads["head_causal"]
    prompts, _ = ao._prompts(2, 40, seed=5)
    new, sizes = 9, (2, 4, 16)
    costs = {2: 1.0, 4: 1.25, 16: 2.0}
    with bc.using_backend("reference"):
        rounds, accepted, greedy = ao.position_table(target, head, prompts, new, 32, 8)
        for groups in ([[0], [1]], [[0, 1]]):
            for n in sizes:
                real = [generate(target, head, [prompts[i] for i in g], max_new_tokens=new,
                                 budget=n) for g in groups]
                replayed = [ao.simulate(rounds, accepted, g, new, costs, sizes, n) for g in groups]
                assert [o.stats.rounds for o in real] == [r[1] for r in replayed], (groups, n)
                assert [t for o in real for t in o.tokens] == greedy
    for b in (0, 1):
        def brute(pos):      # every schedule of sizes, recursively
            if pos >= new:
                return 0.0
            return min(costs[n] + brute(pos + 1 + int(accepted[pos][b, n - 1])) for n in sizes)
        best, _, _ = ao.best_policy_b1(accepted, b, new, costs, sizes)
        assert best == pytest.approx(brute(1))
        fixed = [ao.simulate(rounds, accepted, [b], new, costs, sizes, n)[0] for n in sizes]
        assert best <= min(fixed) + 1e-12
    assert ao.main(["--quick", "--device", "cpu", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "adaptive_oracle.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["batch"], r["policy"]) for r in rows} == {
        *((b, p) for b in ("1", "2") for p in ("4", "16", "auto", "marginal", "clairvoyant")),
        ("1", "optimal"), ("2", "bound")}
    assert all(float(r["tokens_per_s"]) > 0 for r in rows)


def test_attention_headline_side_by_side(tmp_path, capsys):
    """device_check's attention step (bench_tree_attention --headline) on the CPU at small shapes:
    at each of three shapes, SDPA, our backends and `auto` (the note names its pick) in rows that
    stream to the CSV, flex a row saying why not here, and the side-by-side lines with TFLOP/s and
    time over the floor."""
    from bench import bench_tree_attention as bta

    assert bta.main(["--quick", "--headline", "--no-plot", "--device", "cpu",
                     "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    with open(tmp_path / "tree_attention.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    shapes = [f"{b}x{l}x{n}" for b, l, n in bta.HEADLINE_CPU]
    assert list(dict.fromkeys(r["shape"] for r in rows)) == shapes
    for shape in shapes:
        got = {r["backend"]: r for r in rows if r["shape"] == shape}
        assert set(got) == {"sdpa", "reference", "triton", "auto", "flex"}, set(got)
        for name in ("sdpa", "reference", "auto"):
            assert got[name]["status"] == "ok" and float(got[name]["tflops"]) > 0
            assert float(got[name]["time_over_floor"]) > 0
        assert got["auto"]["note"].startswith("auto runs ")
        assert float(got["reference"]["rel_err"]) < 1e-5 and float(got["auto"]["rel_err"]) < 1e-5
        assert got["flex"]["status"] == "skip" and got["flex"]["note"]
    side = out[out.index("== tree_attention side by side"):]
    for shape in shapes:
        block = side[side.index(f"-- {shape}"):].split("\n-- ")[0]
        assert all(f"   {name}" in block for name in ("sdpa", "reference", "auto", "flex"))
        assert "TFLOP/s" in block and "x floor" in block and "x_sdpa" in block
    # the headline shapes proper, on CUDA: the three of docs/perf/tree_attention.md at Qwen3-8B's heads
    assert bta.HEADLINE == [(1, 32768, 256), (4, 16384, 128), (16, 4096, 16)]


def test_every_bench_table_streams_its_rows(tmp_path):
    """A bench killed mid-run keeps the rows it measured: each row reaches the CSV as it is
    added (device_check copies the CSVs after every step)."""
    opts = bc.Options(quick=True, device=torch.device("cpu"), out=tmp_path, backends=["reference"],
                      plot=False, args=None)
    table = bc.Table("verify", opts, bc.Ceilings(1e12, 1e12, "fp32", None, None), ["torch"])
    table.add("1x8", "reference", 1e-3, flops=1e6, nbytes=1e6)
    with open(tmp_path / "verify.csv", newline="") as f:
        assert [r["backend"] for r in csv.DictReader(f)] == ["reference"]


def test_summary_of_a_cut_run_reads_every_result(tmp_path):
    """summarize.py on what a device call returns: the attention sweep's CSV (its own columns:
    no device, backend or median_us) by shape, fastest checked kernel first; host_overhead.txt;
    a CSV of an unknown layout named with its size; a hardware record whose last line a killed
    run cut short (skipped with a warning, the rest counted); exit 0."""
    import json

    res = tmp_path / "results"
    (res / "attention").mkdir(parents=True)
    (res / "attn_sweep.csv").write_text(
        "kernel,shape,status,splits,ctas_per_sm,eager_us,graph_us,tflops,gbps,x_floor,max_rel,"
        "rel_l2,copy_gbps,peak_tflops,note\n"
        'wgmma,1x32Kx256,pass,4,1,400.00,380.00,366.0,367,2.171,0.004,0.002,4300,790,""\n'
        'wide,1x32Kx256,pass,2,1,300.00,nan,463.0,465,1.714,0.004,0.002,4300,790,""\n'
        'tma2,1x32Kx256,FAIL,2,1,0.00,nan,0.0,0,0.000,1,1,4300,790,"max_rel 1 over 0.02"\n')
    (res / "host_overhead.txt").write_text("op backend host_us\ntree_attention cuda 21.5\n")
    (res / "attention" / "extra.csv").write_text("a,b\n1,2\n3,4\n")
    entry = {"nodeid": "tests/ops/test_silu_mul.py::test_silu_mul[triton]",
             "file": "tests/ops/test_silu_mul.py", "test": "test_silu_mul",
             "params": {"backend": "triton"}, "outcome": "passed"}
    (res / "hw_record.jsonl").write_text(json.dumps(entry) + "\n" + json.dumps(entry)[:40])
    (tmp_path / "steps.tsv").write_text("attn_sweep\tPASS\t15\twrote attn_sweep.csv (3 rows)\n")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "summarize.py"), "--steps",
                          str(tmp_path / "steps.tsv"), "--results", str(res)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "unreadable" not in text, text
    sweep = [line for line in text.splitlines() if line.startswith("1x32Kx256")]
    assert [line.split()[1] for line in sweep] == ["wide", "wgmma", "tma2"], sweep
    assert sweep[0].split()[2] == "300" and sweep[1].split()[2] == "380" and "[FAIL]" in sweep[2]
    assert "== host time per eager call (host_overhead.txt) ==" in text
    assert "tree_attention cuda 21.5" in text
    assert "attention/extra.csv: 2 rows; columns a, b" in text
    assert "skipped line 2 of" in text and "passed on this run, every dtype: silu_mul: triton" in text
