"""Qwen3.5 hybrid targets (Gated DeltaNet + gated attention, dense and MoE): Hugging Face parity
(transformers' Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM with their torch fallbacks) in float32
and bf16, checkpoint layouts (text-only, multimodal nesting, per-expert and fused experts), the
cached paths (ragged prefill, decode, tree verify, commit) against a full forward, greedy
decoding against transformers' generate, and config errors."""
import json

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels.decode import generate_ar
from jetspec_kernels.models import CheckpointError, load_safetensors, save_safetensors
from jetspec_kernels.models.config import Qwen3_5Config
from jetspec_kernels.models.qwen3_5 import Qwen3_5
from jetspec_kernels.models.tiny_hybrid import (random_qwen3_5_weights, save_qwen3_5,
                                                tiny_qwen3_5_config)
from helpers import rel_l2 as rel

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("reference_backend")

V = 97


def hf_model(path, *, moe=False, layers=4, seed=0, interval=None):
    """A random transformers hybrid saved to ``path`` with ``save_pretrained`` (per-expert MoE
    tensors, as transformers writes them)."""
    kw = dict(vocab_size=V, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=8, linear_value_head_dim=8, rms_norm_eps=1e-6,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                               "partial_rotary_factor": 0.25})
    if interval is not None:
        kw["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                             for i in range(layers)]
    if moe:
        cfg = transformers.Qwen3_5MoeTextConfig(num_experts=5, num_experts_per_tok=2,
                                                moe_intermediate_size=24,
                                                shared_expert_intermediate_size=20, **kw)
        hf = transformers.Qwen3_5MoeForCausalLM(cfg)
        hf.set_experts_implementation("eager")
    else:
        hf = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(intermediate_size=48, **kw))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(1, 8)))
            else:
                p.normal_(0.0, 0.2 if p.dim() > 1 else 0.1)
    hf.eval().save_pretrained(path)
    return hf


def full_forward(model, seqs):
    """Logits [len, V] and taps [len, L*H] of each sequence run from scratch as a prompt."""
    outs = []
    for s in seqs:
        ids = torch.tensor([s])
        cache = model.new_cache(1, len(s))
        pos = torch.arange(len(s), dtype=torch.int32)[None].contiguous()
        h, taps = model.forward(ids, pos, cache, torch.zeros(1, dtype=torch.int32),
                                prompt_lens=torch.tensor([len(s)], dtype=torch.int32),
                                taps=range(model.config.num_hidden_layers))
        outs.append((model.logits(h)[0], taps[0]))
    return outs


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("interval", [None, 2], ids=["every4", "every2"])
def test_hf_parity_float32(tmp_path, moe, interval):
    hf = hf_model(tmp_path, moe=moe, interval=interval)
    ours = Qwen3_5.from_pretrained(str(tmp_path))
    assert ours.config.moe == moe
    assert ours.config.layer_types == list(hf.config.layer_types)
    ids = torch.randint(0, V, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf.double()(ids, output_hidden_states=True)
    (l0, t0), (l1, t1) = full_forward(ours, ids.tolist())
    for logits, taps, b in ((l0, t0, 0), (l1, t1, 1)):
        assert rel(logits, ref.logits[b]) < 1e-5
        for layer in range(3):      # tap l is Hugging Face hidden_states[l + 1]
            assert rel(taps[:, 32 * layer:32 * (layer + 1)], ref.hidden_states[layer + 1][b]) < 1e-5


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_hf_parity_bf16(tmp_path, moe):
    """In bf16 ours is as close to the float64 result as transformers' own bf16 forward is."""
    hf = hf_model(tmp_path, moe=moe, seed=2)
    ids = torch.randint(0, V, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf.double()(ids).logits[0]
        theirs = hf.bfloat16()(ids).logits[0]
    ours = Qwen3_5.from_pretrained(str(tmp_path), dtype=torch.bfloat16)
    (logits, _), = full_forward(ours, ids.tolist())
    assert logits.dtype == torch.bfloat16
    assert rel(logits, want) < 2 * rel(theirs, want) + 1e-3 and rel(logits, want) < 3e-2


def test_layouts_load_the_same(tmp_path):
    """transformers' fused expert layout (its state_dict), our writer's per-expert layout and the
    multimodal nesting (``text_config``, ``model.language_model.`` tensors, a vision tower and
    MTP tensors ignored) all load to the same model."""
    hf = hf_model(tmp_path / "hf", moe=True)
    save_safetensors(hf.state_dict(), str(tmp_path / "fused"))
    (tmp_path / "fused" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    cfg = Qwen3_5Config.from_file(str(tmp_path / "hf"))
    weights = load_safetensors(str(tmp_path / "hf"))
    weights["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    weights["mtp.layers.0.input_layernorm.weight"] = torch.zeros(3)
    save_qwen3_5(cfg, weights, str(tmp_path / "mm"), multimodal=True)
    mm = json.loads((tmp_path / "mm" / "config.json").read_text())
    assert mm["model_type"] == "qwen3_5_moe" and "text_config" in mm
    models = [Qwen3_5.from_pretrained(str(tmp_path / d)) for d in ("hf", "fused", "mm")]
    ids = [[3, 1, 4, 1, 5, 9, 2, 6]]
    base = full_forward(models[0], ids)[0][0]
    for m in models[1:]:
        assert torch.equal(full_forward(m, ids)[0][0], base)


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def tiny(request):
    cfg = tiny_qwen3_5_config(num_experts=4 if request.param else 0)
    return Qwen3_5(cfg, random_qwen3_5_weights(cfg, seed=4))


@pytest.mark.parametrize("page_size", [None, 4])
def test_cached_paths_match_full_forward(tiny, page_size):
    """Ragged prefill, two decode steps, a tree verify (every node against a full forward of its
    path), then the commit of one path and a decode step after it."""
    model = tiny
    gen = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (7, 3, 5)]
    b = len(seqs)
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    tokens = torch.zeros(b, 7, dtype=torch.int64)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = torch.tensor(s)
    cache = model.new_cache(b, 40, page_size=page_size)
    last, tapped = model.prefill(tokens, lens, cache, taps=[0, 3])
    nxt = [torch.randint(0, V, (2,), generator=gen).tolist() for _ in seqs]
    prefix = lens.clone()
    steps = []
    for k in range(2):
        steps.append(model.decode(torch.tensor([n[k] for n in nxt]), prefix, cache))
        prefix += 1
    tree = jk.draft_tree(torch.randn(b, 3, V, generator=gen), torch.randint(0, V, (b,), generator=gen),
                         budget=9, topk=2)
    ver, vtaps = model.verify(tree, prefix, cache, taps=[0, 3])
    greedy, _ = model.verify(tree, prefix, cache, taps=[0, 3], fused_argmax=True)
    paths = []
    for i, s in enumerate(seqs):
        (full, ftaps), = full_forward(model, [s])
        assert rel(last[i], full[-1]) < 1e-5
        assert rel(tapped[i, :len(s), :64], ftaps[:, :64]) < 1e-5
        (full2, _), = full_forward(model, [s + nxt[i]])
        assert rel(steps[0][i], full2[-2]) < 1e-5 and rel(steps[1][i], full2[-1]) < 1e-5
        par = tree.parents[i].tolist()
        node_paths = {}
        for node in range(int(tree.num_nodes[i])):
            path, cur = [], node
            while cur >= 0:
                path.append(cur)
                cur = par[cur]
            node_paths[node] = path[::-1]
            toks = [int(tree.tokens[i, j]) for j in path[::-1]]
            (fl, ft), = full_forward(model, [s + nxt[i] + toks])
            assert rel(ver[i, node], fl[-1]) < 1e-5
            assert rel(vtaps[i, node, 64:], ft[-1, 3 * 64:]) < 1e-5
            assert int(greedy[i, node]) == int(torch.argmax(ver[i, node]))
        paths.append(node_paths[int(tree.num_nodes[i]) - 1])     # the deepest-numbered node's path
    # Commit one accepted path per sequence (attention K/V by commit_kv, the states by the model).
    cols = tree.max_depth + 1
    path_t = torch.full((b, cols), -1, dtype=torch.int32)
    for i, p in enumerate(paths):
        path_t[i, :len(p)] = torch.tensor(p, dtype=torch.int32)
    accept = torch.tensor([len(p) - 1 for p in paths], dtype=torch.int32)
    verdict = jk.Verdict(accept, path_t, torch.zeros(b, dtype=torch.int32), path_t.clone())
    model.verify(tree, prefix, cache)
    new_prefix = jk.commit_kv(cache.k, cache.v, prefix, verdict, block_table=cache.block_table).prefix_lens
    model.commit_states(cache, verdict)
    after = model.decode(torch.tensor([7, 8, 9]), new_prefix, cache)
    for i, s in enumerate(seqs):
        toks = [int(tree.tokens[i, j]) for j in paths[i]]
        (fl, _), = full_forward(model, [s + nxt[i] + toks + [7 + i]])
        assert rel(after[i], fl[-1]) < 1e-5


def test_commit_needs_a_verified_tree(tiny):
    cache = tiny.new_cache(1, 8)
    z = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="no verified tree"):
        tiny.commit_states(cache, jk.Verdict(z, z[:, None], z, z[:, None]))
    with pytest.raises(TypeError, match="verdict must be"):
        tiny.commit_states(cache, (z, z))


PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17]]


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_greedy_generate_ar_matches_transformers(tmp_path, moe):
    hf = hf_model(tmp_path, moe=moe, seed=6).double()
    ours = generate_ar(Qwen3_5.from_pretrained(str(tmp_path)), PROMPTS, max_new_tokens=8).tokens
    for p, got in zip(PROMPTS, ours):
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert got == want[0, len(p):].tolist()


def _cfg(**over):
    d = tiny_qwen3_5_config().to_dict()
    d.update(over)
    return d


@pytest.mark.parametrize("over, match", [
    (dict(layer_types=["linear_attention"] * 3), "layer_types"),
    (dict(layer_types=["linear_attention"] * 3 + ["sliding_attention"]), "layer_types"),
    (dict(linear_num_key_heads=3), "multiple of linear_num_key_heads"),
    (dict(linear_key_head_dim=None), "linear_key_head_dim"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.1}),
     "rotary dim"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}), "RoPE type"),
    (dict(attn_output_gate=False), "attn_output_gate"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(model_type="qwen3"), "not a Qwen3.5 hybrid"),
    (dict(linear_conv_kernel_dim=1), "linear_conv_kernel_dim"),
    (dict(text_config=[1]), "text_config"),
])
def test_config_errors_name_the_field(over, match):
    with pytest.raises(CheckpointError, match=match):
        Qwen3_5Config.from_dict(_cfg(**over))


def test_config_from_interval_and_nesting():
    d = _cfg()
    del d["layer_types"]
    d["full_attention_interval"] = 2
    assert Qwen3_5Config.from_dict(d).layer_types == ["linear_attention", "full_attention"] * 2
    nested = {"model_type": "qwen3_5", "tie_word_embeddings": True, "text_config": _cfg()}
    cfg = Qwen3_5Config.from_dict(nested)
    assert cfg.tie_word_embeddings and cfg.rotary_dim == 4 and cfg.conv_dim == 2 * 16 + 32


@pytest.mark.parametrize("t, chunk", [(150, 64), (7, 64), (9, 4)])
def test_chunked_recurrence_equals_the_token_steps(t, chunk):
    """The prefill's chunked form equals transformers' recurrent step run token by token (float64),
    padding tokens (g = 0, beta = 0) leave the state, decays near 0 and 1, beta near 0 and 1."""
    from jetspec_kernels.models.gated_delta import chunked_recurrence
    from jetspec_kernels.python_ref.gated_delta_tree import gated_delta_step, l2norm
    gen = torch.Generator().manual_seed(t)
    b, hv, dk, dv = 2, 3, 8, 6
    q = l2norm(torch.randn(b, t, hv, dk, generator=gen, dtype=torch.float64)) / dk ** 0.5
    k = l2norm(torch.randn(b, t, hv, dk, generator=gen, dtype=torch.float64))
    v = torch.randn(b, t, hv, dv, generator=gen, dtype=torch.float64)
    g = -torch.rand(b, t, hv, generator=gen, dtype=torch.float64) * 6     # decay e^-6 .. 1
    beta = torch.rand(b, t, hv, generator=gen, dtype=torch.float64)
    beta[:, ::5] = 1.0
    beta[:, 1::7] = 1e-6
    lens = torch.tensor([t, max(1, t - 3)])
    pad = torch.arange(t)[None, :] >= lens[:, None]
    g[pad], beta[pad] = 0.0, 0.0
    s0 = torch.randn(b, hv, dk, dv, generator=gen, dtype=torch.float64)
    out, state = chunked_recurrence(q, k, v, g, beta, s0, chunk=chunk)
    s = s0
    for i in range(t):
        s, o = gated_delta_step(s, q[:, i], k[:, i], v[:, i], g[:, i], beta[:, i])
        assert rel(out[:, i], o) < 1e-10, i
    assert rel(state, s) < 1e-10


def test_linear_layers_verify_and_commit_without_host_reads(tiny, monkeypatch):
    """The linear layers' tree verify and commit (conv ops, Gated DeltaNet ops, projections) read
    no tensor value on the host (with value checks off, as on CUDA): what lets a CUDA graph hold
    the round. Every host read of a tensor raises here."""
    from jetspec_kernels.models.gated_delta import linear_commit, linear_tree
    model = tiny
    cfg, w = model._local, model.layers[model.linear_layers[0]]
    cache = model.new_cache(2, 16)
    gen = torch.Generator().manual_seed(9)
    a = torch.randn(2, 5, cfg.hidden_size, generator=gen)
    parents = torch.tensor([[-1, 0, 0, 1, 3], [-1, 0, 1, -1, -1]], dtype=torch.int32)
    nodes = torch.tensor([5, 3], dtype=torch.int32)
    path = torch.tensor([[0, 1, 3], [0, 1, -1]], dtype=torch.int32)
    accept = torch.tensor([2, 1], dtype=torch.int32)

    def refuse(*args, **kwargs):
        raise AssertionError("a host read of a tensor value")
    prev = jk.checks._value_checks
    jk.set_value_checks("never")
    try:
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
            monkeypatch.setattr(torch.Tensor, name, refuse)
        for backend in ("reference", "triton"):
            jk.set_backend(backend)
            out, kept = linear_tree(a, w, cfg, parents, nodes, cache.conv[0], cache.recurrent[0],
                                    cache.slots, cfg.rms_norm_eps)
            linear_commit(kept, path, accept, cache.conv[0], cache.recurrent[0], cache.slots)
    finally:
        monkeypatch.undo()
        jk.set_value_checks(prev)
        jk.set_backend("reference")
    assert out.shape == a.shape and bool(torch.isfinite(out).all())
