"""The draft head: JetSpec-format checkpoints load, the forward matches python_ref's draft head,
the cached (incremental-context) path matches the from-scratch one, and bad checkpoints give
errors naming the key."""
import json
import os

import pytest
import torch

import jetspec_kernels as jk
from jetspec_kernels import python_ref as ref
from jetspec_kernels.models import CheckpointError, DraftConfig, DraftHead, save_draft_head
from jetspec_kernels.models.config import default_target_layer_ids
from jetspec_kernels.models.tiny import random_draft_weights, tiny_draft_config, tiny_qwen3_config
from helpers import rel_l2 as rel, undeferred

pytestmark = pytest.mark.usefixtures("reference_backend")


def head_config(causal=True, **kw):
    target = tiny_qwen3_config(num_hidden_layers=6)
    base = dict(num_hidden_layers=2, target_layer_ids=[1, 3, 4], causal_head=causal, block_size=6,
                num_attention_heads=4, num_key_value_heads=1)
    base.update(kw)
    return tiny_draft_config(target, **base)


def embeddings(seed=0, v=97, h=64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(v, h, generator=gen), torch.randn(v, h, generator=gen) / 8


@pytest.mark.parametrize("causal,sharded", [(True, False), (False, True)])
def test_checkpoint_forward_matches_python_ref(tmp_path, causal, sharded):
    cfg = head_config(causal)
    w = random_draft_weights(cfg, seed=7)
    save_draft_head(cfg, w, str(tmp_path), max_shard_bytes=40_000 if sharded else None)
    assert os.path.exists(tmp_path / "model.safetensors.index.json") == sharded
    head = DraftHead.from_pretrained(str(tmp_path), dtype=torch.float32, device="cpu")
    assert head.config.causal_head == causal and head.target_layer_ids == [1, 3, 4]

    embed, lm_head = embeddings()
    gen = torch.Generator().manual_seed(8)
    hidden = torch.randn(2, 9, 3 * 64, generator=gen)
    anchor = torch.tensor([5, 90])
    out = head.draft_logits(hidden, anchor, embed_weight=embed, lm_head_weight=lm_head)
    assert out.shape == (2, 5, 97)
    with open(tmp_path / "config.json") as f:
        raw_cfg = json.load(f)
    want = ref.draft_head_forward({k: v.double() for k, v in w.items()}, raw_cfg, hidden.double(),
                                  anchor, embed.double(), lm_head.double())
    assert rel(out, want) < 1e-5


@pytest.mark.parametrize("page_size", [None, 3])
def test_incremental_context_matches_fresh(page_size):
    """Context appended over several calls with ragged counts (junk rows past the counts) gives the
    same logits as the whole context at once."""
    cfg = head_config(True)
    head = DraftHead(cfg, random_draft_weights(cfg, seed=9))
    embed, lm_head = embeddings(1)
    gen = torch.Generator().manual_seed(10)
    total = [7, 4]
    hidden = torch.randn(2, 7, 3 * 64, generator=gen)
    state = head.new_state(2, 24, page_size=page_size)
    state.cache.k.fill_(float("nan"))
    state.cache.v.fill_(float("nan"))
    done = [0, 0]
    for counts in ([3, 1], [0, 2], [4, 1]):
        m = max(counts) + 1
        rows = torch.randn(2, m, 3 * 64, generator=gen)          # junk beyond counts
        for b in range(2):
            rows[b, :counts[b]] = hidden[b, done[b]:done[b] + counts[b]]
            done[b] += counts[b]
        head.append_context(state, rows, torch.tensor(counts, dtype=torch.int32))
    assert done == total and state.ctx_len.tolist() == total
    anchor = torch.tensor([11, 12])
    cached = head.cached_logits(state, anchor, embed_weight=embed, lm_head_weight=lm_head)
    for b in range(2):
        fresh = head.draft_logits(hidden[b:b + 1, :total[b]], anchor[b:b + 1], embed_weight=embed,
                                  lm_head_weight=lm_head)
        assert rel(cached[b:b + 1], fresh) < 1e-5
    # A second draft over the same context (block slots overwritten) gives the same logits.
    again = head.cached_logits(state, anchor, embed_weight=embed, lm_head_weight=lm_head)
    assert torch.equal(again, cached)


def test_bad_checkpoints_name_the_key(tmp_path):
    cfg = head_config()
    w = random_draft_weights(cfg)
    missing = {k: v for k, v in w.items() if k != "layers.1.self_attn.k_norm.weight"}
    with pytest.raises(CheckpointError, match=r"layers\.1\.self_attn\.k_norm\.weight"):
        DraftHead(cfg, missing)
    bad = dict(w, **{"fc.weight": torch.zeros(64, 128)})
    with pytest.raises(CheckpointError, match=r"'fc\.weight' has shape \[64, 128\], expected \[64, 192\]"):
        DraftHead(cfg, bad)
    no_norm = {k: v for k, v in w.items() if k != "hidden_norm.weight"}
    save_draft_head(cfg, no_norm, str(tmp_path))
    with pytest.raises(CheckpointError, match="hidden_norm.weight"):
        DraftHead.from_pretrained(str(tmp_path))


def test_config_defaults_and_errors():
    d = head_config().to_dict()
    del d["dflash_config"]["target_layer_ids"]
    d["num_target_layers"] = 36
    d["num_hidden_layers"] = 5
    assert DraftConfig.from_dict(d).target_layer_ids == ref.target_layer_ids(36, 5)
    for L, n in [(36, 1), (28, 3), (40, 5), (8, 2)]:
        assert default_target_layer_ids(L, n) == ref.target_layer_ids(L, n)
    no_mask = head_config().to_dict()
    del no_mask["dflash_config"]["mask_token_id"]
    with pytest.raises(ValueError, match="mask_token_id"):
        DraftConfig.from_dict(no_mask)
    no_ids = head_config().to_dict()
    del no_ids["dflash_config"]["target_layer_ids"]
    no_ids["num_target_layers"] = 0
    with pytest.raises(ValueError, match="target_layer_ids"):
        DraftConfig.from_dict(no_ids)


def oracle_layer(x, w, eps, theta, q_pos, context=None, causal=True):
    """python_ref's decoder_layer with a plain float64 attention: block rows at RoPE positions
    ``q_pos`` see the ``context`` rows (positions 0..T-1) and the block (causally or fully)."""
    t, n = (0 if context is None else context.shape[1]), x.shape[1]
    k_pos = torch.cat([torch.arange(t), q_pos])
    vis = torch.ones(n, t + n, dtype=torch.bool)
    if causal:
        vis[:, t:] = torch.ones(n, n, dtype=torch.bool).tril()

    def attend(q, k, v, lw):
        q, k = ref.qk_norm_rope(q, k, lw, eps, q_pos, k_pos, theta)
        g = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
        s = torch.einsum("bnhd,bmhd->bhnm", q, k) / q.shape[-1] ** 0.5
        return torch.einsum("bhnm,bmhd->bnhd", s.masked_fill(~vis, float("-inf")).softmax(-1), v)

    return ref.decoder_layer(x, w, attend, eps, context=context)


@pytest.mark.parametrize("causal", [True, False])
def test_every_layer_is_the_same_layer(causal):
    """The target's layer, the draft head's layer and the training modules' layers, on the same
    weights and inputs, match python_ref's decoder_layer (so none of them can drift alone)."""
    from jetspec_kernels.models import Qwen3
    from jetspec_kernels.models.tiny import random_qwen3_weights
    from jetspec_kernels.train.modules import head_forward, target_forward

    tcfg = tiny_qwen3_config(num_hidden_layers=1)
    tw = random_qwen3_weights(tcfg, seed=21)
    layer = {k.removeprefix("model.layers.0."): v for k, v in tw.items() if k.startswith("model.layers.0.")}
    layer64 = {k: v.double() for k, v in layer.items()}
    eps, theta = tcfg.rms_norm_eps, tcfg.rope_theta
    embed, lm_head = tw["model.embed_tokens.weight"], tw["lm_head.weight"]
    tokens = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(22))
    want = oracle_layer(embed.double()[tokens], layer64, eps, theta, torch.arange(10))

    target = Qwen3(tcfg, tw)
    cache = target.new_cache(2, 10)
    pos = torch.arange(10, dtype=torch.int32).expand(2, 10).contiguous()
    _, got = target.forward(tokens, pos, cache, torch.zeros(2, dtype=torch.int32), taps=[0])
    assert rel(got, want) < 1e-5
    assert rel(target_forward(tw, tcfg, tokens, taps=[0])[1], want) < 1e-5

    # The draft head's layer: the same layer weights, context rows in front of the block.
    dcfg = tiny_draft_config(tcfg, target_layer_ids=[0], causal_head=causal)
    dw = dict(random_draft_weights(dcfg, seed=23), **{"layers.0." + k: v for k, v in layer.items()})
    p, s = 6, dcfg.block_size
    taps = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(24))
    ctx = ref.rms_norm(taps[:, :p].double() @ dw["fc.weight"].double().t(), dw["hidden_norm.weight"], eps)
    block = torch.full((2, s), dcfg.mask_token_id)
    block[:, 0] = tokens[:, p]
    h = oracle_layer(embed.double()[block], layer64, eps, theta, p + torch.arange(s), ctx, causal)
    want_hidden = ref.rms_norm(h, dw["norm.weight"], eps)[:, 1:]

    head = DraftHead(dcfg, dw)
    state = head.new_state(2, p + s)
    head.append_context(state, taps[:, :p], torch.full((2,), p, dtype=torch.int32))
    assert rel(head.draft_hidden(state, tokens[:, p], embed), want_hidden) < 1e-5
    got_logits = head_forward(dw, dcfg, taps, tokens, torch.full((2, 1), p), embed, lm_head)[:, 0]
    assert rel(got_logits, want_hidden @ lm_head.double().t()) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_norms_are_one_rms_norm_call_each(monkeypatch, dtype):
    """Every norm of the head is one call of the public rms_norm on ``fused_ops_backend``, every
    residual add fused into the norm after it (the attention's into the post-attention norm, the
    MLP's into the next layer's input norm or the final norm): the context norm, then two calls a
    layer, each with a residual but the first layer's input norm. Under the Triton interpreter
    (float32) the fused kernels give the reference's logits."""
    import jetspec_kernels.triton as triton_backend
    from jetspec_kernels.backend import triton_interpret
    cfg = head_config(True)
    head = DraftHead(cfg, {k: v.to(dtype) for k, v in random_draft_weights(cfg, seed=11).items()})
    embed, lm_head = (t.to(dtype) for t in embeddings(2))
    hidden = torch.randn(2, 5, 3 * 64, generator=torch.Generator().manual_seed(12)).to(dtype)
    anchor = torch.tensor([3, 4])
    want = head.draft_logits(hidden, anchor, embed_weight=embed, lm_head_weight=lm_head)

    calls = []
    real = triton_backend.rms_norm

    def spy(x, residual, weight, eps):
        calls.append(residual is not None)
        return real(x, residual, weight, eps)

    monkeypatch.setattr(triton_backend, "rms_norm", spy)
    head.fused_ops_backend = "triton"
    if not triton_interpret() and not torch.cuda.is_available():
        pytest.skip("triton needs TRITON_INTERPRET=1 on the CPU")
    got = head.draft_logits(hidden, anchor, embed_weight=embed, lm_head_weight=lm_head)
    layers = cfg.num_hidden_layers
    assert calls == [False, False] + [True] * (2 * layers)
    if dtype == torch.float32:
        assert rel(got, want) < 1e-5


def test_deferred_residual_adds_change_no_bit(monkeypatch):
    """The MLP's residual add runs in the next layer's input norm or the final norm: in bf16 the
    drafted logits equal, bit for bit, those with every add where the layer computed it before."""
    import jetspec_kernels.models.draft_head as head_module
    cfg = head_config(True)
    head = DraftHead(cfg, {k: v.bfloat16() for k, v in random_draft_weights(cfg, seed=13).items()})
    embed, lm_head = (t.bfloat16() for t in embeddings(2))
    hidden = torch.randn(2, 5, 3 * 64, generator=torch.Generator().manual_seed(14)).bfloat16()
    anchor = torch.tensor([3, 4])
    got = head.draft_logits(hidden, anchor, embed_weight=embed, lm_head_weight=lm_head)
    monkeypatch.setattr(head_module, "decoder_layer", undeferred(head_module.decoder_layer))
    assert torch.equal(got, head.draft_logits(hidden, anchor, embed_weight=embed,
                                               lm_head_weight=lm_head))
