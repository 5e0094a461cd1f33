"""What a decoding round must cost, computed from the model configs alone (no weights, no GPU):
bytes and FLOPs per stage, floors and predicted times, the device memory a bench config needs,
and the device time of a bench plan.

Stages of one greedy round of B sequences at prefix P with a budget-n tree (block S, depth
D = S - 1), as bench_decode splits it:
  draft          the head's forward over S rows (its context of P rows read from its KV cache),
                 the fused lm_head + top-K over D depths (one read of the lm_head), the tree.
  verify         the target's forward over B*n tree tokens (every weight read once; a MoE layer
                 reads the experts the tokens touch), tree attention over P + n keys (the whole
                 KV prefix read once), the fused argmax over the vocabulary for every node.
  accept_commit  verify_tree, commit_kv of the accepted path (K and V read and written), the
                 head's context append (fc + K/V projections of the accepted rows), the emit.
A stage's floor is max(bytes / copy bandwidth, FLOPs / matmul rate); the round's floor is the sum
over stages (they run one after another). The AR step's floor is one target forward over B
tokens at prefix P; prefill's is one causal forward over B*P tokens (its attention FLOPs halved)
plus the head's context append.

Predicted time = max(bytes / (MEM_EFF * bandwidth), FLOPs / (MMA_EFF * rate)) per stage, plus
SMALL_LAUNCH_S per launch that is not a GEMM or an attention kernel (norms, residual adds, casts,
the tree and verify kernels: in a CUDA graph each costs about its launch gap and a short wave).
Launch counts per layer were counted on the CPU (``LAUNCHES``; tests/test_bench_decode.py recounts
them with ``decode_round.HostReads``). These are predictions to check against the GPU, not results.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from jetspec_kernels.launch_plan import argmax_chunk

# Ceilings measured on this workplace's machines (.library/device KINDS.md; docs/perf/README.md,
# "Ceilings"): device-to-device copy, bytes read + written; bf16 8192^3 matmul on random data.
@dataclass(frozen=True)
class Ceiling:
    bandwidth: float          # bytes/s
    flops: float              # FLOP/s
    name: str


H200 = Ceiling(4.3e12, 790e12, "H200 (copy 4.3 TB/s, bf16 matmul 790 TFLOP/s)")
H100 = Ceiling(3.0e12, 798e12, "H100 (copy 3.0 TB/s, bf16 matmul 798 TFLOP/s)")

MEM_EFF = 0.85          # memory-bound GEMV / attention kernels: share of copy bandwidth reached
MMA_EFF = 0.6           # compute-bound GEMMs at these shapes: share of the matmul rate
SMALL_LAUNCH_S = 2.5e-6  # one small kernel in a CUDA graph (launch gap + one short wave)

# Kernel launches (aten ops that run device work, plus one per backend kernel), counted on the CPU
# with the reference backend (tests/test_bench_decode.py::test_launch_counts recounts them). Each
# rms_norm call counts one: what it launches once a GPU backend runs it (see :func:`launches`).
LAUNCHES = {
    "target_layer": 9,        # one target decoder layer, any token count (2 rms_norm, 1 silu_mul)
    "head_layer": 9,          # one head layer in the draft forward (2 rms_norm, 1 silu_mul)
    "head_append_layer": 2,   # one head layer's K/V projection (one GEMM) + cache append
    "sparse_extra": 14,       # extra launches of a MoE layer (routing, sort, grouped GEMMs, scatter)
    "draft_fixed": 9,         # embedding, block build, final norm, fused top-K, tree
    "verify_fixed": 6,        # embedding, final norm, tree positions (the argmax: argmax_launches)
    "accept_commit_fixed": 21,  # verify_tree, commit_kv, fc + norm, emit (7), state updates
    "ar_fixed": 6,            # embedding, final norm, lm_head, argmax, advance
    "tap": 1,                 # a tapped target layer's residual add (elsewhere the next norm adds it)
}
# rms_norm calls in a LAUNCHES entry: (plain norms, norms with the residual add in front). Each
# layer's norms both add (the MLP's residual add deferred to the next norm); the first layer's input
# norm is plain and the final norm adds, so the fixed entries keep one plain norm. A tap turns the
# next norm's add into its own launch: one plain norm more, one adding norm fewer.
NORM_CALLS = {"target_layer": (0, 2), "head_layer": (0, 2), "draft_fixed": (1, 0),
              "verify_fixed": (1, 0), "accept_commit_fixed": (1, 0), "ar_fixed": (1, 0),
              "tap": (1, -1)}
# One rms_norm call run as torch ops (auto, until a GPU backend of rms_norm passes on hardware:
# backend.REFERENCE_UNTIL_VERIFIED), the Hugging Face form in bf16: cast, square, mean, + eps,
# rsqrt, the product rounded as it is stored (the reference backend, ops/_reference.py), weight;
# one more with the residual add.
TORCH_NORM_LAUNCHES = 7
# silu_mul calls in a LAUNCHES entry, and one call's launches as torch ops (silu, product).
SILU_MUL_CALLS = {"target_layer": 1, "head_layer": 1}
TORCH_SILU_MUL_LAUNCHES = 2
BIG_PER_LAYER = 5             # of a layer's launches: 4 GEMMs (q/k/v and gate/up fused) + attention
                              # (timed by bytes/FLOPs)


# Whether the models' fused layer ops (rms_norm, silu_mul) are one kernel a call: None (default)
# as auto runs each on a GPU (one kernel once a GPU backend of it is hardware-verified); a bench
# that runs them on a chosen backend sets it (bench_decode --fused-ops-backend).
FUSED_OPS: bool | None = None


def ops_fused(fn: str) -> bool:
    """``FUSED_OPS`` when set, else whether auto runs a GPU backend for interface function
    ``fn`` (rms_norm or silu_mul)."""
    if FUSED_OPS is not None:
        return FUSED_OPS
    from jetspec_kernels.backend import verified_backends
    return bool(verified_backends(fn))


def argmax_launches(rows: int, vocab: int, elt: int) -> int:
    """Launches of Qwen3.argmax over ``rows`` hidden rows: one pass is the GEMM, the argmax and
    the cast; in n vocabulary chunks (launch_plan.argmax_chunk) each chunk is its GEMM slice and
    max, and the merge four (argmax over the chunks, gather, add, cast)."""
    chunks = math.ceil(vocab / argmax_chunk(rows, vocab, elt))
    return 3 if chunks == 1 else 2 * chunks + 4


def launches(key: str) -> int:
    """``LAUNCHES[key]``, each rms_norm and silu_mul call counted as the torch ops it runs
    unless :func:`ops_fused`."""
    n = LAUNCHES[key]
    if not ops_fused("rms_norm"):
        plain, with_add = NORM_CALLS.get(key, (0, 0))
        n += plain * (TORCH_NORM_LAUNCHES - 1) + with_add * TORCH_NORM_LAUNCHES
    if not ops_fused("silu_mul"):
        n += SILU_MUL_CALLS.get(key, 0) * (TORCH_SILU_MUL_LAUNCHES - 1)
    return n


@dataclass(frozen=True)
class Cost:
    """Bytes moved, FLOPs, kernel launches and how many of them are GEMMs / attention."""

    nbytes: float = 0.0
    flops: float = 0.0
    launches: int = 0
    big: int = 0

    def __add__(self, o: "Cost") -> "Cost":
        return Cost(self.nbytes + o.nbytes, self.flops + o.flops, self.launches + o.launches,
                    self.big + o.big)

    def floor(self, c: Ceiling) -> float:
        return max(self.nbytes / c.bandwidth, self.flops / c.flops)

    def predicted(self, c: Ceiling) -> float:
        work = max(self.nbytes / (MEM_EFF * c.bandwidth), self.flops / (MMA_EFF * c.flops))
        return work + max(0, self.launches - self.big) * SMALL_LAUNCH_S


@dataclass(frozen=True)
class Model:
    """The sizes the costs need, from a target config and a draft-head config (``elt`` bytes per
    weight / cache element). Parameter counts are of matrices (norm vectors are negligible)."""

    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    dense_params: int          # every target layer's matrices a token always reads (no experts)
    expert_params: int         # one expert (gate + up + down)
    sparse_layers: int
    experts: int
    top_k: int
    moe_inter: int
    all_params: int            # every target matrix, every expert (the weights held)
    lm_head: int               # V * H
    tied: bool
    head_layers: int
    head_layer_params: int     # one head layer's matrices
    head_fc: int
    head_kv_params: int        # one head layer's k_proj + v_proj
    head_q_heads: int
    head_kv_heads: int
    head_head_dim: int
    block: int
    taps: int
    elt: int = 2
    name: str = field(default="", compare=False)

    @classmethod
    def from_configs(cls, tcfg, dcfg, elt: int = 2, name: str = "") -> "Model":
        from jetspec_kernels.models.config import Qwen3MoeConfig
        from jetspec_kernels.models.init import layer_shapes, target_layer_shapes

        def count(shapes, keep=lambda k: True):
            return sum(math.prod(s) for k, s in shapes.items() if len(s) >= 2 and keep(k))

        moe = isinstance(tcfg, Qwen3MoeConfig)
        sparse = [i for i in range(tcfg.num_hidden_layers) if moe and tcfg.is_sparse(i)]
        per_layer = [target_layer_shapes(tcfg, i) for i in range(tcfg.num_hidden_layers)]
        dense = sum(count(s, lambda k: not k.startswith("mlp.experts.")) for s in per_layer)
        experts = tcfg.num_experts if moe else 0
        expert = 3 * tcfg.hidden_size * tcfg.moe_intermediate_size if moe else 0
        hs = layer_shapes(dcfg)
        return cls(
            layers=tcfg.num_hidden_layers, hidden=tcfg.hidden_size, q_heads=tcfg.num_attention_heads,
            kv_heads=tcfg.num_key_value_heads, head_dim=tcfg.head_dim, inter=tcfg.intermediate_size,
            vocab=tcfg.vocab_size, dense_params=dense, expert_params=expert, sparse_layers=len(sparse),
            experts=experts, top_k=tcfg.num_experts_per_tok if moe else 0,
            moe_inter=tcfg.moe_intermediate_size if moe else 0,
            all_params=dense + len(sparse) * experts * expert, lm_head=tcfg.vocab_size * tcfg.hidden_size,
            tied=bool(tcfg.tie_word_embeddings), head_layers=dcfg.num_hidden_layers,
            head_layer_params=count(hs),
            head_fc=dcfg.hidden_size * len(dcfg.target_layer_ids) * dcfg.target_hidden_size,
            head_kv_params=count(hs, lambda k: k in ("self_attn.k_proj.weight", "self_attn.v_proj.weight")),
            head_q_heads=dcfg.num_attention_heads, head_kv_heads=dcfg.num_key_value_heads,
            head_head_dim=dcfg.head_dim, block=dcfg.block_size, taps=len(dcfg.target_layer_ids),
            elt=elt, name=name)

    @classmethod
    def of_size(cls, size: str, elt: int = 2) -> "Model":
        """The model of a bench_decode / model_setup size name ("8b", "30b_a3b", "tiny", ...)."""
        from bench import model_setup as ms
        return cls.from_configs(*ms.configs(size), elt=elt, name=size)

    @property
    def head_params(self) -> int:
        return self.head_layers * self.head_layer_params + self.head_fc

    def touched_experts(self, tokens: int) -> float:
        """Distinct experts of one sparse layer that ``tokens`` tokens touch, expected under
        uniform routing (random weights route about uniformly; a trained router less)."""
        if not self.experts:
            return 0.0
        return self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** tokens)

    def weight_bytes(self) -> float:
        """Every weight held on the device: target (all experts), embedding, lm_head, head."""
        held = self.all_params + self.lm_head * (1 if self.tied else 2) + self.head_params
        return float(held * self.elt)

    def kv_bytes_per_position(self) -> tuple[int, int]:
        """(target, head) KV-cache bytes per sequence position, K and V, every layer."""
        return (2 * self.layers * self.kv_heads * self.head_dim * self.elt,
                2 * self.head_layers * self.head_kv_heads * self.head_head_dim * self.elt)


def target_forward(m: Model, batch: int, new: int, prefix: int, *, logits_rows: int,
                   causal: bool = False, argmax: bool = False, taps: int = 0) -> Cost:
    """One target forward of ``new`` tokens per sequence over ``prefix`` cached positions;
    ``logits_rows`` rows go through the lm_head (fused argmax: :func:`argmax_launches`);
    ``causal``: the new tokens attend causally among themselves (prefill; half the tail FLOPs);
    ``taps``: tapped layers (the head's). Norm launches as :func:`launches` counts them."""
    tokens = batch * new
    read = m.dense_params + m.sparse_layers * m.touched_experts(tokens) * m.expert_params + m.lm_head
    active = m.dense_params + m.sparse_layers * m.top_k * m.expert_params
    kv_pos, _ = m.kv_bytes_per_position()
    kv = batch * (prefix + new) * kv_pos + batch * new * kv_pos     # read every key once, write the new
    tail = new * new / 2 if causal else new * new
    attn = 4 * m.layers * batch * (new * prefix + tail) * m.q_heads * m.head_dim
    flops = 2 * tokens * active + attn + 2 * logits_rows * m.vocab * m.hidden
    n = (m.layers * launches("target_layer") + m.sparse_layers * LAUNCHES["sparse_extra"]
         + launches("verify_fixed") + taps * launches("tap"))
    if argmax:
        n += argmax_launches(logits_rows, m.vocab, m.elt)
    return Cost(read * m.elt + kv, flops, n, m.layers * BIG_PER_LAYER)


def round_costs(m: Model, batch: int, prefix: int, budget: int) -> dict[str, Cost]:
    """{draft, verify, accept_commit} of one greedy round (module docstring)."""
    s, d = m.block, m.block - 1
    _, kv_head = m.kv_bytes_per_position()
    head_attn = 4 * m.head_layers * batch * s * (prefix + s) * m.head_q_heads * m.head_head_dim
    draft = Cost(
        nbytes=(m.head_layers * m.head_layer_params + m.lm_head) * m.elt + batch * (prefix + 2 * s) * kv_head,
        flops=(2 * batch * s * m.head_layers * m.head_layer_params + head_attn
               + 2 * batch * d * m.vocab * m.hidden),
        launches=launches("draft_fixed") + m.head_layers * launches("head_layer"),
        big=m.head_layers * BIG_PER_LAYER + 1)
    verify = target_forward(m, batch, budget, prefix, logits_rows=batch * budget, argmax=True,
                            taps=m.taps)
    width = min(d, budget - 1) + 1
    kv_pos, _ = m.kv_bytes_per_position()
    append = m.head_fc + m.head_layers * m.head_kv_params
    accept = Cost(
        nbytes=append * m.elt + 2 * batch * width * kv_pos + batch * width * kv_head,
        flops=2 * batch * width * append,
        launches=launches("accept_commit_fixed") + m.head_layers * LAUNCHES["head_append_layer"],
        big=1 + m.head_layers)
    return {"draft": draft, "verify": verify, "accept_commit": accept}


def ar_step(m: Model, batch: int, prefix: int) -> Cost:
    """One autoregressive step: B tokens at prefix P, full logits for B rows, argmax."""
    c = target_forward(m, batch, 1, prefix, logits_rows=batch)
    return Cost(c.nbytes, c.flops, c.launches - launches("verify_fixed") + launches("ar_fixed"), c.big)


def prefill(m: Model, batch: int, prompt: int) -> Cost:
    """The causal prefill of B prompts of P tokens, and the head's context append of them."""
    c = target_forward(m, batch, prompt, 0, logits_rows=batch, causal=True, taps=m.taps)
    _, kv_head = m.kv_bytes_per_position()
    append = m.head_fc + m.head_layers * m.head_kv_params
    # the first token: the last rows' logits and their argmax (launched as the one-pass argmax)
    first = argmax_launches(batch, m.vocab, m.elt)
    return c + Cost(append * m.elt + batch * prompt * kv_head, 2 * batch * prompt * append, first)


# ----------------------------------------------------------------------------------------------
# Device memory of one bench config
# ----------------------------------------------------------------------------------------------

MEMORY_SLACK = 2 * 2 ** 30      # cuBLAS workspaces, allocator rounding, events, the graphs' own


def row_bytes(m: Model) -> float:
    """Activation bytes one token row holds at the peak of a target layer: x, residual and
    normed input (3 H), fp32 norm temporaries (2 H fp32), q/k/v/attention out
    (2 (Hq + Hkv) Dh), gate, up, silu(gate) and their product (4 I, or per routed copy of a MoE
    row: k (2 H + 4 I_moe) plus sort indices), and the taps the head reads (n_taps H)."""
    mlp = (m.top_k * (2 * m.hidden + 4 * m.moe_inter) + 2 * 8 * m.top_k / m.elt) if m.experts else 4 * m.inter
    per = 3 * m.hidden + 2 * m.hidden * 4 / m.elt + 2 * (m.q_heads + m.kv_heads) * m.head_dim + mlp
    return (per + m.taps * m.hidden) * m.elt


def memory(m: Model, batch: int, prompt: int, budget: int, capacity: int, chunk: int) -> dict[str, float]:
    """Bytes on the device for one bench config: weights, the two KV caches, and the larger of
    the prefill's chunk activations and the round's (held twice: the library's graph pool and the
    stage graphs' pool; the verify forward's rows plus two argmax chunks of logits alive), plus
    ``MEMORY_SLACK``. Keys: weights, kv, head_kv, prefill, round, slack, total."""
    kv_pos, kv_head = m.kv_bytes_per_position()
    rows_prefill = batch * min(chunk, prompt)
    rows_verify = batch * budget
    round_ = 2 * rows_verify * (row_bytes(m) + 2 * argmax_chunk(rows_verify, m.vocab, m.elt) * m.elt)
    parts = {"weights": m.weight_bytes(), "kv": float(batch * capacity * kv_pos),
             "head_kv": float(batch * capacity * kv_head), "prefill": rows_prefill * row_bytes(m),
             "round": round_, "slack": float(MEMORY_SLACK)}
    parts["total"] = (parts["weights"] + parts["kv"] + parts["head_kv"]
                      + max(parts["prefill"], parts["round"]) + parts["slack"])
    return parts


# ----------------------------------------------------------------------------------------------
# Device time of a bench plan
# ----------------------------------------------------------------------------------------------

STARTUP_S = 20.0            # imports, ceilings, random weights drawn on the GPU
COMPILE_FIRST_S = 25.0      # every Triton kernel of the round and the AR step, cold cache
COMPILE_NEW_SHAPE_S = 5.0   # specialisations a new (B, budget) adds (a warm cache: none)
CAPTURE_S = 1.5             # library graphs + stage graphs (each runs the round's Python once)
PROFILE_S = 3.0             # torch.profiler around a few rounds (start, stop, trace)
PREFILL_EFF = 0.4           # the prefill reaches this share of its floor's rate
TIMED_S = 1.0               # device seconds of timed replays per config and kind
MIN_REPLAYS, MAX_REPLAYS = 5, 20
COUNTED_ROUNDS, PROFILED_ROUNDS = 3, 5
PROFILED_BUDGET = 64        # the budget whose rounds are profiled (GPU busy), one per group


@dataclass(frozen=True)
class Config:
    batch: int
    prompt: int
    budget: int

    @property
    def label(self) -> str:
        return f"B{self.batch}/p{self.prompt}/n{self.budget}"


def replays(seconds_each: float) -> int:
    """Timed replays of a graph that takes ``seconds_each``: about TIMED_S of device time,
    between MIN_REPLAYS and MAX_REPLAYS."""
    return max(MIN_REPLAYS, min(MAX_REPLAYS, int(TIMED_S / max(seconds_each, 1e-9))))


def round_seconds(m: Model, cfg: Config, c: Ceiling) -> float:
    """Predicted seconds of one round of ``cfg``."""
    return sum(x.predicted(c) for x in round_costs(m, cfg.batch, cfg.prompt, cfg.budget).values())


def config_seconds(m: Model, cfg: Config, c: Ceiling, first: bool) -> float:
    """Predicted device seconds of one config: compilation, capture, the profiler (at
    PROFILED_BUDGET), and the replays (timed library rounds, stage-split rounds, the host-sync
    count and the profiled rounds)."""
    t = round_seconds(m, cfg, c)
    profiled = cfg.budget == PROFILED_BUDGET
    n = 2 * replays(t) + COUNTED_ROUNDS + (PROFILED_ROUNDS if profiled else 0) + 1
    return ((COMPILE_FIRST_S if first else COMPILE_NEW_SHAPE_S) + CAPTURE_S
            + (PROFILE_S if profiled else 0.0) + n * t)


def group_seconds(m: Model, batch: int, prompt: int, c: Ceiling, chunk: int) -> float:
    """Predicted seconds of a (batch, prompt) group's shared work: the prefill (its first chunk
    twice) and the AR step (capture + replays)."""
    chunks = math.ceil(prompt / chunk)
    pre = prefill(m, batch, prompt).floor(c) / PREFILL_EFF * (1 + 1 / chunks)
    t_ar = ar_step(m, batch, prompt).predicted(c)
    return pre + CAPTURE_S + (replays(t_ar) + 2) * t_ar


def plan_seconds(m: Model, plan: list[Config], c: Ceiling, chunk: int) -> list[float]:
    """Predicted device seconds after each config of ``plan`` (cumulative, in order, startup and
    each group's shared work included)."""
    total, groups, out = STARTUP_S, set(), []
    for i, cfg in enumerate(plan):
        if (cfg.batch, cfg.prompt) not in groups:
            groups.add((cfg.batch, cfg.prompt))
            total += group_seconds(m, cfg.batch, cfg.prompt, c, chunk)
        total += config_seconds(m, cfg, c, first=i == 0)
        out.append(total)
    return out
