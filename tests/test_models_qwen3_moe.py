"""Qwen3-MoE targets: Hugging Face parity over the sparse-MLP settings (both expert paths), the
per-expert and fused checkpoint layouts, cached paths (prefill, decode, tree verify) against a
full forward, greedy decoding against transformers, lossless speculative decoding, the CLI, and
checkpoints whose MoE fields disagree with their tensors."""
import json
import shutil

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels.__main__ import main as package_main
from jetspec_kernels.decode import generate, generate_ar
from jetspec_kernels.models import (CheckpointError, DraftHead, Qwen3, Qwen3Config, load_safetensors,
                                    save_draft_head, save_safetensors)
from jetspec_kernels.models.config import Qwen3MoeConfig
from jetspec_kernels.models.tiny import random_draft_weights, tiny_draft_config
from helpers import rel_l2 as rel
from test_decode import OracleHead
from test_models_qwen3 import full_forward

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("reference_backend")

V = 101


def hf_moe(path, *, hidden=32, layers=3, seed=0, **moe):
    """A random transformers Qwen3MoeForCausalLM (eager experts, so it runs in float64), saved to
    ``path`` with ``save_pretrained``."""
    fields = dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=False,
                  decoder_sparse_step=1, mlp_only_layers=[])
    fields.update(moe)
    cfg = transformers.Qwen3MoeConfig(vocab_size=V, hidden_size=hidden, intermediate_size=48,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=8, rope_theta=10000.0,
                                      rms_norm_eps=1e-6, **fields)
    torch.manual_seed(seed)
    hf = transformers.Qwen3MoeForCausalLM(cfg).eval()
    hf.set_experts_implementation("eager")
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.save_pretrained(path)
    return hf


def run_full(model, ids):
    """Final hidden, logits and every layer's tap of a causal forward over ``ids`` [B, T]."""
    b, t = ids.shape
    pos = torch.arange(t, dtype=torch.int32).expand(b, t).contiguous()
    hidden, taps = model.forward(ids, pos, model.new_cache(b, t), torch.zeros(b, dtype=torch.int32),
                                 taps=range(model.config.num_hidden_layers))
    return model.logits(hidden), taps


@pytest.mark.parametrize("moe", [
    dict(num_experts_per_tok=2, norm_topk_prob=False),
    dict(num_experts_per_tok=1, norm_topk_prob=True),
    dict(num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=2),
    dict(num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[0, 2]),
    dict(num_experts_per_tok=6, norm_topk_prob=True),
], ids=["k2", "k1-norm", "k3-norm-step2", "k2-mlp-only", "k6-all"])
def test_hf_parity(tmp_path, moe):
    hf = hf_moe(tmp_path, **moe)
    ours = Qwen3.from_pretrained(str(tmp_path))
    assert isinstance(ours.config, Qwen3MoeConfig)
    sparse = [isinstance(layer.mlp, transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock)
              for layer in hf.model.layers]
    assert [ours.config.is_sparse(i) for i in range(3)] == sparse and any(sparse)
    ids = torch.randint(0, V, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf.double()(ids, output_hidden_states=True)
    for grouped_mm in (False, True):
        ours.experts_grouped_mm = grouped_mm
        logits, taps = run_full(ours, ids)
        assert rel(logits, ref.logits) < 1e-5, grouped_mm
        for layer in range(2):      # tap l is Hugging Face hidden_states[l + 1] (the last is normed)
            assert rel(taps[..., 32 * layer:32 * (layer + 1)], ref.hidden_states[layer + 1]) < 1e-5


def test_fused_expert_layout_loads_the_same(tmp_path):
    """transformers' own in-memory layout (gate_up_proj [E, 2I, H], gate rows first; down_proj
    [E, H, I]) saved as a checkpoint loads to the same model as the per-expert layout."""
    hf = hf_moe(tmp_path / "per_expert", mlp_only_layers=[1])
    state = hf.state_dict()
    assert list(state["model.layers.0.mlp.experts.gate_up_proj"].shape) == [6, 48, 32]
    assert list(state["model.layers.0.mlp.experts.down_proj"].shape) == [6, 32, 24]
    save_safetensors(state, str(tmp_path / "fused"))
    shutil.copy(tmp_path / "per_expert" / "config.json", tmp_path / "fused" / "config.json")
    a = Qwen3.from_pretrained(str(tmp_path / "per_expert"))
    b = Qwen3.from_pretrained(str(tmp_path / "fused"))
    for la, lb in zip(a.layers, b.layers):
        assert la.keys() == lb.keys() and all(torch.equal(la[k], lb[k]) for k in la)
    ids = torch.randint(0, V, (1, 9), generator=torch.Generator().manual_seed(2))
    la, _ = run_full(a, ids)
    lb, _ = run_full(b, ids)
    assert torch.equal(la, lb)
    with torch.no_grad():
        assert rel(lb, hf.double()(ids).logits) < 1e-5


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    """A saved 2-layer hidden-64 MoE target (layer 0 sparse, top-2 of 6 renormalised; layer 1 dense)."""
    path = tmp_path_factory.mktemp("moe64")
    hf = hf_moe(path, hidden=64, layers=2, seed=3, norm_topk_prob=True, mlp_only_layers=[1])
    return path, hf


@pytest.fixture(scope="module")
def moe_model(moe_dir):
    return Qwen3.from_pretrained(str(moe_dir[0]))


def test_cached_paths_match_full_forward(moe_model):
    model = moe_model
    gen = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (6, 3)]
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    tokens = torch.zeros(2, 6, dtype=torch.int64)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = torch.tensor(s)
    cache = model.new_cache(2, 32)
    last, tapped = model.prefill(tokens, lens, cache, taps=[0, 1])
    nxt = [torch.randint(0, V, (2,), generator=gen).tolist() for _ in seqs]
    prefix = lens.clone()
    steps = []
    for k in range(2):
        steps.append(model.decode(torch.tensor([n[k] for n in nxt]), prefix, cache))
        prefix += 1
    tree = jk.draft_tree(torch.randn(2, 3, V, generator=gen), torch.randint(0, V, (2,), generator=gen),
                         budget=7, topk=2)
    ver, vtaps = model.verify(tree, prefix, cache, taps=[0, 1])
    greedy, _ = model.verify(tree, prefix, cache, taps=[0, 1], fused_argmax=True)

    for i, s in enumerate(seqs):
        (full, ftaps), = full_forward(model, [s])
        assert rel(last[i], full[-1]) < 1e-5
        assert rel(tapped[i, :len(s)], ftaps) < 1e-5
        (full2, _), = full_forward(model, [s + nxt[i]])
        assert rel(steps[0][i], full2[-2]) < 1e-5 and rel(steps[1][i], full2[-1]) < 1e-5
        par = tree.parents[i].tolist()
        for node in range(int(tree.num_nodes[i])):
            path, cur = [], node
            while cur >= 0:
                path.append(int(tree.tokens[i, cur]))
                cur = par[cur]
            (fl, ft), = full_forward(model, [s + nxt[i] + path[::-1]])
            assert rel(ver[i, node], fl[-1]) < 1e-5
            assert rel(vtaps[i, node], ft[-1]) < 1e-5
            assert int(greedy[i, node]) == int(torch.argmax(ver[i, node]))


PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17]]


def test_greedy_generate_ar_matches_transformers(moe_dir, moe_model):
    _, hf = moe_dir
    ours = generate_ar(moe_model, PROMPTS, max_new_tokens=10).tokens
    for p, got in zip(PROMPTS, ours):
        with torch.no_grad():
            want = hf.double().generate(torch.tensor([p]), max_new_tokens=10, do_sample=False,
                                        pad_token_id=0)
        assert got == want[0, len(p):].tolist()


def test_speculative_decoding_is_lossless(moe_model):
    target = moe_model
    ar = generate_ar(target, PROMPTS, max_new_tokens=16).tokens
    dcfg = tiny_draft_config(target.config, target_layer_ids=[0, 1])
    head = DraftHead(dcfg, random_draft_weights(dcfg, seed=7))
    assert generate(target, head, PROMPTS, max_new_tokens=6, budget=16, topk=3).tokens == \
        [t[:6] for t in ar]
    # A head proposing the target's own continuation: long accepted paths through sparse layers.
    oracle = OracleHead([p + t for p, t in zip(PROMPTS, ar)], V)
    out = generate(target, oracle, PROMPTS, max_new_tokens=16, budget=16, topk=3, fused_draft=False)
    assert out.tokens == ar and out.stats.mean_accept > 2.0


def test_cli_runs_a_moe_target(moe_dir, moe_model, tmp_path, capsys):
    dcfg = tiny_draft_config(moe_model.config)
    save_draft_head(dcfg, random_draft_weights(dcfg, seed=1), str(tmp_path / "head"))
    rc = package_main(["generate", "--target", str(moe_dir[0]), "--head", str(tmp_path / "head"),
                       "--prompt", "5 6 7", "--max-new-tokens", "6", "--budget", "8", "--ar",
                       "--backend", "reference"])
    out = capsys.readouterr().out
    assert rc == 0 and "greedy outputs match" in out
    want = generate_ar(moe_model, [[5, 6, 7]], max_new_tokens=6).tokens[0]
    assert " ".join(map(str, want)) in out


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    """(config dict, per-expert weights) of a 2-layer MoE target: layer 0 sparse (4 experts),
    layer 1 dense (mlp_only_layers)."""
    path = tmp_path_factory.mktemp("moe_small")
    hf_moe(path, layers=2, num_experts=4, mlp_only_layers=[1])
    with open(path / "config.json") as f:
        return json.load(f), load_safetensors(str(path))


def test_bad_checkpoints_name_the_tensor(small_checkpoint):
    d, w = small_checkpoint
    cfg = Qwen3Config.from_dict(d)
    Qwen3(cfg, w)                       # the untouched checkpoint loads
    ex = "model.layers.0.mlp.experts."

    def fails(match, **change):
        bad = {k: v for k, v in w.items() if change.get(k, v) is not None}
        bad.update({k: v for k, v in change.items() if v is not None})
        with pytest.raises(CheckpointError, match=match):
            Qwen3(cfg, bad)

    fails(r"'model\.layers\.0\.mlp\.gate\.weight' has shape \[5, 32\], expected \[4, 32\]",
          **{"model.layers.0.mlp.gate.weight": torch.zeros(5, 32)})
    fails(r"'model\.layers\.0\.mlp\.experts\.2\.up_proj\.weight' has shape \[24, 31\]",
          **{ex + "2.up_proj.weight": torch.zeros(24, 31)})
    fails(r"missing tensor 'model\.layers\.0\.mlp\.experts\.3\.down_proj\.weight'",
          **{ex + "3.down_proj.weight": None})
    fails(r"'model\.layers\.0\.mlp\.experts\.4\.gate_proj\.weight' is beyond the num_experts=4",
          **{ex + "4.gate_proj.weight": torch.zeros(24, 32)})
    fails(r"both the fused tensor 'model\.layers\.0\.mlp\.experts\.gate_up_proj'",
          **{ex + "gate_up_proj": torch.zeros(4, 48, 32)})
    fails(r"'model\.layers\.1\.mlp\.gate\.weight' is not used",      # layer 1 is dense
          **{"model.layers.1.mlp.gate.weight": torch.zeros(4, 32)})
    fused = {k: v for k, v in w.items() if not k.startswith(ex)}
    fused[ex + "gate_up_proj"] = torch.zeros(4, 48, 32)
    fused[ex + "down_proj"] = torch.zeros(4, 24, 32)               # transposed: [E, I, H]
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.experts\.down_proj' has shape "
                                              r"\[4, 24, 32\], expected \[4, 32, 24\]"):
        Qwen3(cfg, fused)


def test_bad_moe_config_fields(small_checkpoint):
    d, _ = small_checkpoint
    assert d["num_local_experts"] == 4 and "num_experts" not in d     # what save_pretrained writes
    released = {k: v for k, v in d.items() if k != "num_local_experts"}
    cfg = Qwen3Config.from_dict({**released, "num_experts": 4})
    assert cfg.num_experts == 4 and Qwen3Config.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"num_experts_per_tok \(5\) exceeds num_experts \(4\)"):
        Qwen3MoeConfig(**{**cfg.__dict__, "num_experts_per_tok": 5})
    for change, match in [
        ({"num_experts_per_tok": 5}, r"'num_experts_per_tok' \(5\) exceeds 'num_experts' \(4\)"),
        ({"num_experts": 3}, r"'num_experts' \(3\) and 'num_local_experts' \(4\) disagree"),
        ({"num_local_experts": None}, r"has no 'num_experts'"),
        ({"mlp_only_layers": [2]}, r"'mlp_only_layers' must be a list of layer ids in \[0, 2\)"),
        ({"decoder_sparse_step": 0}, r"'decoder_sparse_step' must be an int >= 1"),
        ({"moe_intermediate_size": None}, r"has no 'moe_intermediate_size'"),
        ({"norm_topk_prob": 1}, r"'norm_topk_prob' must be true or false"),
    ]:
        with pytest.raises(CheckpointError, match=match):
            Qwen3Config.from_dict({**d, **change})
    # A dense-MLP checkpoint does not load as a MoE one: the router is missing.
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.1\.mlp\.gate\.weight'"):
        Qwen3(Qwen3Config.from_dict({**d, "mlp_only_layers": []}), small_checkpoint[1])


def test_bench_decode_quick_moe(tmp_path, capsys):
    """bench_decode --model moe: the CPU quick run times a tiny MoE target's round (grouped
    experts, one host read per round), and its costs count k experts per token for one token and
    every expert for many."""
    import csv
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from bench import bench_decode, decode_costs as dc

    assert bench_decode.main(["--quick", "--device", "cpu", "--model", "moe", "--no-plot",
                              "--out", str(tmp_path)]) == 0
    assert "MoE 8 experts top-2" in capsys.readouterr().out
    with open(tmp_path / "decode.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    assert [r["backend"] for r in rows] == ["prefill", "ar", "spec", "spec"]
    assert all(float(r["host_syncs_per_round"]) == 1.0 for r in rows if r["backend"] == "spec")

    m = dc.Model.of_size("tiny_moe", elt=4)
    expert = 3 * 64 * 32
    assert m.all_params - m.dense_params == 2 * 8 * expert and m.expert_params == expert
    one, many = dc.ar_step(m, 1, 0), dc.target_forward(m, 1, 10 ** 4, 0, logits_rows=1)
    kv = 2 * 2 * 2 * 16 * 4
    assert one.nbytes == 4 * (m.dense_params + 2 * 2 * expert + m.lm_head) + 2 * kv
    assert many.nbytes == pytest.approx(4 * (m.all_params + m.lm_head) + 2 * 10 ** 4 * kv)


def test_grouped_mm_selection(monkeypatch):
    """The experts' grouped GEMM: torch.nn.functional.grouped_mm where torch has it (2.10 on),
    else torch._grouped_mm (2.8, 2.9), else the per-expert loop, which reads row counts on the
    host and so cannot be captured in a CUDA graph. The private op computes what the loop does;
    grouped_mm=True without either raises."""
    import types
    import torch.nn.functional as F
    from jetspec_kernels.models import moe

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(5, 16, generator=gen)
    weights, experts = moe.route(x, torch.randn(4, 16, generator=gen), 2, True)
    gate_up, down = torch.randn(4, 16, 16, generator=gen), torch.randn(4, 16, 8, generator=gen)
    loop = moe.grouped_experts(x, weights, experts, gate_up, down, grouped_mm=False)
    cuda_bf16 = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)

    if hasattr(F, "grouped_mm"):
        assert moe.grouped_mm_impl() is F.grouped_mm
        monkeypatch.delattr(F, "grouped_mm")
    assert moe.grouped_mm_impl() is torch._grouped_mm and moe._use_grouped_mm(cuda_bf16)
    assert not moe._use_grouped_mm(types.SimpleNamespace(is_cuda=True, dtype=torch.float16))
    assert not moe._use_grouped_mm(x)
    private = moe.grouped_experts(x, weights, experts, gate_up, down, grouped_mm=True)
    assert rel(private, loop) < 1e-6

    monkeypatch.delattr(torch, "_grouped_mm")
    assert moe.grouped_mm_impl() is None and not moe._use_grouped_mm(cuda_bf16)
    assert torch.equal(moe.grouped_experts(x, weights, experts, gate_up, down), loop)
    with pytest.raises(RuntimeError, match="neither torch.nn.functional.grouped_mm nor"):
        moe.grouped_experts(x, weights, experts, gate_up, down, grouped_mm=True)
