"""The Qwen3 target: Hugging Face parity, checkpoint loading and errors, and that the cached
paths (prefill, one-token decode, tree verify; contiguous and paged caches) agree with a full
causal forward."""
import json
import os

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import launch_plan
from jetspec_kernels.models import CheckpointError, Qwen3, Qwen3Config, save_qwen3
from jetspec_kernels.models.layer import decoder_layer as model_layer
from jetspec_kernels.models.tiny import random_qwen3_weights, tiny_qwen3_config
from helpers import rel_l2 as rel, undeferred

pytestmark = pytest.mark.usefixtures("reference_backend")


def full_forward(model, seqs):
    """Logits [len, V] and taps [len, L*H] of each sequence run from scratch, causally."""
    outs = []
    for s in seqs:
        ids = torch.tensor([s])
        cache = model.new_cache(1, len(s))
        pos = torch.arange(len(s), dtype=torch.int32)[None].contiguous()
        h, taps = model.forward(ids, pos, cache, torch.zeros(1, dtype=torch.int32),
                                taps=range(model.config.num_hidden_layers))
        outs.append((model.logits(h)[0], taps[0]))
    return outs


@pytest.fixture(scope="module")
def tiny():
    cfg = tiny_qwen3_config(num_hidden_layers=3)
    return Qwen3(cfg, random_qwen3_weights(cfg, seed=3))


@pytest.mark.parametrize("tied,sharded", [(False, False), (True, True)])
def test_hf_parity(tmp_path, tied, sharded):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_cfg = transformers.Qwen3Config(vocab_size=101, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=16, tie_word_embeddings=tied, rope_theta=10000.0,
                                      rms_norm_eps=1e-6)
    hf = transformers.Qwen3ForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.save_pretrained(tmp_path, max_shard_size="20KB" if sharded else "5GB")
    assert os.path.exists(tmp_path / "model.safetensors.index.json") == sharded

    ours = Qwen3.from_pretrained(str(tmp_path), dtype=torch.float32)
    assert ours.config.tie_word_embeddings == tied
    ids = torch.randint(0, 101, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf.double()(ids, output_hidden_states=True)
    cache = ours.new_cache(2, 11)
    pos = torch.arange(11, dtype=torch.int32).expand(2, 11).contiguous()
    hidden, taps = ours.forward(ids, pos, cache, torch.zeros(2, dtype=torch.int32), taps=[0, 1])
    assert rel(ours.logits(hidden), ref.logits) < 1e-5
    # Tap l is layer l's output: Hugging Face hidden_states[l + 1].
    assert rel(taps[..., :64], ref.hidden_states[1]) < 1e-5
    assert rel(taps[..., 64:], ref.hidden_states[2]) < 1e-5


@pytest.mark.parametrize("page_size", [None, 4])
def test_cached_paths_match_full_forward(tiny, page_size):
    gen = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (6, 3, 9)]
    b, t = len(seqs), max(len(s) for s in seqs)
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    tokens = torch.zeros(b, t, dtype=torch.int64)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = torch.tensor(s)
    cache = tiny.new_cache(b, 32, page_size=page_size)
    taps = [0, 2]
    cache.k.fill_(float("nan"))
    cache.v.fill_(float("nan"))
    last, tapped = tiny.prefill(tokens, lens, cache, taps=taps)

    # Two decode steps, then a tree over the result.
    nxt = [torch.randint(0, 97, (2,), generator=gen).tolist() for _ in seqs]
    prefix = lens.clone()
    step_logits = []
    for k in range(2):
        tok = torch.tensor([n[k] for n in nxt])
        step_logits.append(tiny.decode(tok, prefix, cache))
        prefix += 1
    draft = torch.randn(b, 3, 97, generator=gen)
    roots = torch.randint(0, 97, (b,), generator=gen)
    tree = jk.draft_tree(draft, roots, budget=8, topk=3)
    ver, vtaps = tiny.verify(tree, prefix, cache, taps=taps)
    greedy, _ = tiny.verify(tree, prefix, cache, taps=taps, fused_argmax=True)

    for i, s in enumerate(seqs):
        (full, ftaps), = full_forward(tiny, [s])
        assert rel(last[i], full[-1]) < 1e-5
        assert rel(tapped[i, :len(s)], ftaps[:, list(range(0, 64)) + list(range(128, 192))]) < 1e-5
        (full2, _), = full_forward(tiny, [s + nxt[i]])
        assert rel(step_logits[0][i], full2[-2]) < 1e-5
        assert rel(step_logits[1][i], full2[-1]) < 1e-5
        n = int(tree.num_nodes[i])
        par = tree.parents[i].tolist()
        for node in range(n):
            path, cur = [], node
            while cur >= 0:
                path.append(int(tree.tokens[i, cur]))
                cur = par[cur]
            (fl, ft), = full_forward(tiny, [s + nxt[i] + path[::-1]])
            assert rel(ver[i, node], fl[-1]) < 1e-5
            assert rel(vtaps[i, node], ft[-1, list(range(0, 64)) + list(range(128, 192))]) < 1e-5
            assert int(greedy[i, node]) == int(torch.argmax(ver[i, node]))


def test_save_load_roundtrip_and_key_errors(tmp_path):
    cfg = tiny_qwen3_config()
    w = random_qwen3_weights(cfg, seed=2)
    save_qwen3(cfg, w, str(tmp_path / "single"))
    save_qwen3(cfg, w, str(tmp_path / "sharded"), max_shard_bytes=30_000)
    assert os.path.exists(tmp_path / "sharded" / "model.safetensors.index.json")
    for d in ("single", "sharded"):
        m = Qwen3.from_pretrained(str(tmp_path / d))
        assert torch.equal(m.layers[1]["mlp.up_proj.weight"], w["model.layers.1.mlp.up_proj.weight"])
        assert torch.equal(m.lm_head_weight, w["lm_head.weight"])

    missing = {k: v for k, v in w.items() if k != "model.layers.1.self_attn.k_norm.weight"}
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight"):
        Qwen3(cfg, missing)
    bad = dict(w)
    bad["model.layers.0.mlp.down_proj.weight"] = torch.zeros(64, 127)
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.down_proj\.weight.*\[64, 127\]"):
        Qwen3(cfg, bad)
    untied = {k: v for k, v in w.items() if k != "lm_head.weight"}
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        Qwen3(cfg, untied)

    with open(tmp_path / "sharded" / "model.safetensors.index.json") as f:
        victim = sorted(set(json.load(f)["weight_map"].values()))[-1]
    os.remove(tmp_path / "sharded" / victim)
    with pytest.raises(CheckpointError, match=victim):
        Qwen3.from_pretrained(str(tmp_path / "sharded"))


def test_tied_embeddings_and_config_errors(tmp_path):
    cfg = tiny_qwen3_config(tie_word_embeddings=True)
    w = random_qwen3_weights(cfg, seed=4)
    save_qwen3(cfg, w, str(tmp_path))
    m = Qwen3.from_pretrained(str(tmp_path))
    assert m.lm_head_weight is m.embed_weight

    d = cfg.to_dict()
    with pytest.raises(ValueError, match="RoPE type 'yarn'"):
        Qwen3Config.from_dict({**d, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="vocab_size"):
        Qwen3Config.from_dict({k: v for k, v in d.items() if k != "vocab_size"})
    v5 = {**d, "rope_theta": None, "rope_parameters": {"rope_type": "default", "rope_theta": 5.0}}
    assert Qwen3Config.from_dict(v5).rope_theta == 5.0


@pytest.mark.parametrize("min_chunk,cap,chunks", [(256, 0, 4), (512, 0, 2), (256, 3 * 300 * 4, 4),
                                                   (256, 3 * 768 * 4, 2), (256, 3 * 1000 * 4, 1)])
def test_argmax_over_vocabulary_chunks_ties_to_the_lower_id(monkeypatch, min_chunk, cap, chunks):
    """Qwen3.argmax reads the vocabulary in chunks (launch_plan.argmax_chunk: as few as the
    logits cap allows, never smaller than the minimum, one pass when all fit): a tie between ids
    in different chunks goes to the lower id (torch.argmax's rule, which generate_ar and the
    reference use), so greedy speculative output stays equal to the baseline; the best id in the
    last, partial chunk is found; leading dims and zero rows keep their shape."""
    monkeypatch.setattr(launch_plan, "ARGMAX_MIN_CHUNK", min_chunk)
    monkeypatch.setattr(launch_plan, "ARGMAX_CHUNK_BYTES", cap)
    cfg = tiny_qwen3_config(vocab_size=1000, hidden_size=16, intermediate_size=32,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            num_hidden_layers=1)
    model = Qwen3(cfg, random_qwen3_weights(cfg, seed=4))
    chunk = launch_plan.argmax_chunk(3, 1000, 4)
    assert -(-1000 // chunk) == chunks
    hidden = torch.randn(3, 16, generator=torch.Generator().manual_seed(5))
    lm = model.lm_head_weight
    lm[[7, 256 + 7, 512 + 7, 999]] = 100.0 * hidden[0]          # ties across every boundary
    lm[768 + 20] = 100.0 * hidden[1]                             # the best id in the last chunk
    calls = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda x, w: calls.append(w.shape[0]) or real(x, w))
    want = torch.argmax(model.logits(hidden), dim=-1).to(torch.int32)
    calls.clear()
    assert want[:2].tolist() == [7, 768 + 20]
    assert torch.equal(model.argmax(hidden), want)
    assert calls == [min(chunk, 1000 - i) for i in range(0, 1000, chunk)]
    assert torch.equal(model.argmax(hidden.view(1, 3, 16)), want.view(1, 3))
    got = model.argmax(hidden.clone().requires_grad_(True))     # max(out=) has no autograd
    assert torch.equal(got, want) and not got.requires_grad
    assert model.argmax(hidden[:0].view(2, 0, 16)).shape == (2, 0)


def test_projections_are_one_gemm_each_and_the_checkpoint_keys_views():
    """q/k/v and gate/up run as one GEMM each (models.projections): the checkpoint keys are row
    views of the concatenation the forward runs (an in-place edit shows in both, and a sum over a
    layer's tensors counts each weight once), also after a move; the forward gives what the
    separate projections give."""
    from jetspec_kernels.models.projections import GATE_UP, GATE_UP_KEY, QKV, QKV_KEY
    from jetspec_kernels import python_ref as ref
    cfg = tiny_qwen3_config(num_hidden_layers=2)
    w = random_qwen3_weights(cfg, seed=4)
    model = Qwen3(cfg, w)
    model._move("cpu")
    for layer, run in zip(model.layers, model._run_layers):
        assert QKV_KEY not in layer and GATE_UP_KEY not in layer
        for key, parts in ((QKV_KEY, QKV), (GATE_UP_KEY, GATE_UP)):
            whole = run[key]
            assert torch.equal(whole, torch.cat([layer[p] for p in parts]))
            assert all(layer[p].untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
                       for p in parts)
    assert sum(t.numel() for layer in model.layers for t in layer.values()) == sum(
        t.numel() for k, t in w.items() if "layers." in k)
    model.layers[0]["self_attn.k_proj.weight"][0, 0] = 123.0
    assert model._run_layers[0][QKV_KEY][cfg.num_attention_heads * cfg.head_dim, 0] == 123.0

    # The fused forward (the models' layer on the stacked projections) against python_ref's
    # layer on the checkpoint keys alone, one layer, causal.
    x = torch.randn(2, 5, cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    def attend(q, k, v, lw):
        q, k = ref.qk_norm_rope(q, k, lw, cfg.rms_norm_eps, torch.arange(5), torch.arange(5),
                                cfg.rope_theta)
        mask = torch.ones(5, 5, dtype=torch.bool).tril()
        rep = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        s = torch.einsum("bnhd,bmhd->bhnm", q, k) / cfg.head_dim ** 0.5
        return torch.einsum("bhnm,bmhd->bnhd", s.masked_fill(~mask, float("-inf")).softmax(-1), v)
    fused = model_layer(x, model._run_layers[1], attend, cfg.rms_norm_eps)
    separate = ref.decoder_layer(x, model.layers[1], attend, cfg.rms_norm_eps)
    assert rel(fused, separate) < 1e-6


@pytest.mark.parametrize("taps", [(), (1,), (0, 2)], ids=str)
def test_deferred_residual_adds_change_no_bit(monkeypatch, taps):
    """The MLP's residual add runs in the next layer's input norm or the final norm (or, at a
    tapped layer, where it was): in bf16 the hidden states and taps equal, bit for bit, those of
    the forward with every add where the layer computed it before."""
    import jetspec_kernels.models.qwen3 as qwen3_module
    cfg = tiny_qwen3_config(num_hidden_layers=3)
    model = Qwen3(cfg, {k: v.bfloat16() for k, v in random_qwen3_weights(cfg, seed=5).items()})
    ids = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(6))
    pos = torch.arange(7, dtype=torch.int32).expand(2, 7).contiguous()

    def run():
        return model.forward(ids, pos, model.new_cache(2, 7), torch.zeros(2, dtype=torch.int32),
                             taps=taps)
    hidden, tapped = run()
    monkeypatch.setattr(qwen3_module, "decoder_layer", undeferred(qwen3_module.decoder_layer))
    want_hidden, want_tapped = run()
    assert torch.equal(hidden, want_hidden)
    assert (tapped is None and want_tapped is None) or torch.equal(tapped, want_tapped)
