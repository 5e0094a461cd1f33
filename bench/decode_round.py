"""The decoding round as bench_decode times it, and a guard that counts or refuses host reads.

- :func:`prefill`: one chunked prefill per (batch, prompt), shared by every budget and by the
  autoregressive baseline (:meth:`Prefilled.reset` puts the round state back between them; the
  cache slots past the prompt are overwritten by whoever runs next).
- :func:`new_round`: the library's round (``jetspec_kernels.decode``'s ``SpeculativeDecode``, stepped by its
  ``StepRunner``: the draft graph and the verify graph that ``generate`` replays).
- :class:`StageGraphs`: the same round cut into one CUDA graph per stage group (draft = head
  forward + top-K + tree; verify = target forward + tree attention; accept_commit = verify_tree,
  commit_kv, the head's context append and the emit), replayed with events between them for the
  split; on the CPU, the stages run eagerly under perf_counter timers.
- :class:`ARStep`: one greedy autoregressive step of the target on static buffers (decode +
  argmax + advance), captured once as a CUDA graph, so AR and speculative decoding are compared
  graph to graph. (``generate_ar`` itself runs eagerly; a library-level captured AR step is
  follow-up work for the decode package.)
- :class:`HostReads`: a torch function + dispatch mode that counts (or refuses) every read of a
  tensor value by the host (``.item()``, ``.tolist()``, ``bool(t)``, ``nonzero``, boolean
  indexing, cross-device copies, ``synchronize``) outside the backends' kernels, and can record
  every op with its output shapes. The CPU tests run the round under it; the GPU bench counts
  host syncs per round with it.

Decode internals used: ``SpeculativeDecode``, ``StepRunner``, ``TokenBuffer``, ``NoStages``,
``StageTimers``, ``Sampling``, ``verdict_cols`` and ``cache_capacity`` (one import place:
:func:`_decode`).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Stage names of decode.speculative.SpeculativeDecode -> the group they are timed in.
STAGE_GROUPS = {"draft": "draft", "tree": "draft", "verify": "verify", "accept": "accept_commit",
                "commit": "accept_commit", "append": "accept_commit", "emit": "accept_commit"}
GROUPS = ("draft", "verify", "accept_commit")


def _decode():
    from types import SimpleNamespace

    from jetspec_kernels.decode.arguments import Sampling
    from jetspec_kernels.decode.graphs import StepRunner
    from jetspec_kernels.decode.output import TokenBuffer
    from jetspec_kernels.decode.speculative import SpeculativeDecode, cache_capacity, verdict_cols
    from jetspec_kernels.decode.stages import NoStages, StageTimers
    return SimpleNamespace(Sampling=Sampling, StepRunner=StepRunner, TokenBuffer=TokenBuffer,
                           SpeculativeDecode=SpeculativeDecode, cache_capacity=cache_capacity,
                           verdict_cols=verdict_cols, NoStages=NoStages, StageTimers=StageTimers)


@dataclass
class Prefilled:
    """The state after a prefill: caches, prefix lengths int32 [B] and anchor tokens int32 [B]
    (the round mutates them in place; :meth:`reset` restores them)."""

    cache: object
    dstate: object
    prefix: torch.Tensor
    anchor: torch.Tensor
    capacity: int
    chunk_seconds: list

    def __post_init__(self):
        self._saved = (self.prefix.clone(), self.anchor.clone(), self.dstate.ctx_len.clone())

    def reset(self) -> None:
        """Prefix, anchor and the draft context length back to their values after the prefill."""
        for live, saved in zip((self.prefix, self.anchor, self.dstate.ctx_len), self._saved):
            live.copy_(saved)


def prefill(target, head, tokens: torch.Tensor, capacity: int, chunk: int, timer) -> Prefilled:
    """Prefill equal-length prompts ``tokens`` int64 [B, P] in chunks of ``chunk`` positions per
    sequence (activations of one chunk at a time: B * chunk rows through the target, the MoE's
    routed rows k times that), appending the head's context chunk by chunk.

    ``timer(fn)`` runs ``fn`` and returns its seconds (device-synchronised events on CUDA). The
    first chunk runs twice, the first time as warm-up (kernel compilation), untimed.
    Returns :class:`Prefilled` with caches of ``capacity`` positions per sequence.
    """
    b, p = tokens.shape
    dev = tokens.device
    cache = target.new_cache(b, capacity)
    dstate = head.new_state(b, capacity)
    taps = head.target_layer_ids
    last = {}

    def run_chunk(c0, count_ctx):
        c1 = min(p, c0 + chunk)
        pos = torch.arange(c0, c1, device=dev, dtype=torch.int32).expand(b, c1 - c0).contiguous()
        start = torch.full((b,), c0, device=dev, dtype=torch.int32)
        hidden, tapped = target.forward(tokens[:, c0:c1], pos, cache, start, taps=taps)
        if count_ctx:          # the warm-up leaves the draft context as it was
            head.append_context(dstate, tapped, torch.full((b,), c1 - c0, device=dev, dtype=torch.int32))
        last["hidden"] = hidden[:, -1]

    run_chunk(0, False)
    seconds = [timer(lambda c0=c0: run_chunk(c0, True)) for c0 in range(0, p, chunk)]
    anchor = torch.argmax(target.logits(last["hidden"]), dim=-1).to(torch.int32)
    prefix = torch.full((b,), p, device=dev, dtype=torch.int32)
    return Prefilled(cache, dstate, prefix, anchor, capacity, seconds)


def new_round(target, head, pre: Prefilled, budget: int, topk: int, max_new: int, stages=None):
    """A greedy fixed-budget round of the library over ``pre``'s state (shared, mutated in place)
    and a fresh output buffer of ``max_new`` tokens per sequence (no EOS: never done before)."""
    d = _decode()
    cols = d.verdict_cols(head, budget)
    out = d.TokenBuffer(pre.prefix.shape[0], max_new, cols, None, pre.prefix.device)
    return d.SpeculativeDecode(target, head, pre.cache, pre.dstate, pre.prefix, pre.anchor, out, sizes=(budget,),
                    topk=topk, algorithm="topn", sampling=d.Sampling(0.0, None, None), seed=0,
                    fused_draft=True, stages=stages or d.NoStages())


def library_steps(rnd, cuda_graphs: bool):
    """decode.graphs.StepRunner over ``rnd``: eager, or the draft graph + verify graph ``generate`` replays
    (captured after their first, eager, run)."""
    return _decode().StepRunner(rnd, cuda_graphs)


def capacity(prompt: int, rounds: int, budget: int, block: int) -> int:
    """Cache positions per sequence for ``rounds`` rounds after a ``prompt``-token prefill (every
    round may emit ``block`` tokens), as generate sizes them."""
    cols = min(block - 1, budget - 1) + 1
    return _decode().cache_capacity(prompt, rounds * cols, budget, block, cols)


class StageGraphs:
    """One round of ``rnd`` (a fixed budget of ``size``) cut into a graph per stage group.

    After one eager round on the capture stream (workspaces, handles), capture follows the
    round's stage names (``STAGE_GROUPS``): entering a stage of another
    group ends the graph being captured and begins the next, so the code between two stages of
    a group lands in that group's graph. All graphs share one private pool; the round's state
    lives outside it. ``replay(events)`` runs them in order, recording an event before the first
    and after each (CUDA). On the CPU (``cuda=False``) nothing is captured: ``replay`` runs the
    steps eagerly and returns per-group seconds.
    """

    def __init__(self, rnd, size: int, cuda: bool):
        self.rnd, self.size, self.cuda = rnd, size, cuda
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self._open = None
        if not cuda:
            return
        self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        real, rnd.stages = rnd.stages, self._cut
        torch.cuda.synchronize()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                rnd.stages = _decode().NoStages()     # one eager round on this stream first
                rnd.draft_step(True)
                rnd.verify_step(size)
                side.synchronize()
                rnd.stages = self._cut
                rnd.draft_step(True)
                self._end()
                rnd.verify_step(size)
                self._end()
        finally:
            self._end()
            rnd.stages = real
        torch.cuda.current_stream().wait_stream(side)
        if tuple(self.graphs) != GROUPS:
            raise RuntimeError(f"stage graphs {tuple(self.graphs)}, expected {GROUPS}: the round's "
                               "stage names changed (decode_round.STAGE_GROUPS)")

    @contextmanager
    def _cut(self, name: str):
        group = STAGE_GROUPS.get(name)
        if group is None:
            raise RuntimeError(f"unknown round stage {name!r} (decode_round.STAGE_GROUPS)")
        if group != self._open:
            self._end()
            g = torch.cuda.CUDAGraph()
            g.capture_begin(pool=self._pool)
            self.graphs[group], self._open = g, group
        yield

    def _end(self):
        if self._open is not None:
            self.graphs[self._open].capture_end()
            self._open = None

    def replay(self):
        """One round. CUDA: a list of len(GROUPS) + 1 recorded events; CPU: {group: seconds}."""
        if self.cuda:
            events = [torch.cuda.Event(enable_timing=True)]
            events[0].record()
            for g in self.graphs.values():
                g.replay()
                events.append(torch.cuda.Event(enable_timing=True))
                events[-1].record()
            return events
        d = _decode()
        stages = d.StageTimers(torch.device("cpu"))
        real, self.rnd.stages = self.rnd.stages, stages
        try:
            self.rnd.draft_step(True)
            self.rnd.verify_step(self.size)
        finally:
            self.rnd.stages = real
        out = dict.fromkeys(GROUPS, 0.0)
        for name, sec in stages.result().items():
            out[STAGE_GROUPS[name]] += sec
        return out


class ARStep:
    """One greedy autoregressive step of ``target`` on static buffers: the decode forward of one
    token per sequence at ``prefix`` (its K/V land there), the argmax, the advance. The state
    starts from ``pre`` (a copy: the round's state is untouched). ``capture()`` records it as one
    CUDA graph after an eager warm-up step; ``__call__`` replays it (or runs it eagerly)."""

    def __init__(self, target, pre: Prefilled):
        self.target, self.cache = target, pre.cache
        self.token = pre.anchor.to(torch.int64).clone()
        self.prefix = pre.prefix.clone()
        self.graph = None

    def step(self) -> None:
        logits = self.target.decode(self.token, self.prefix, self.cache)
        self.token.copy_(torch.argmax(logits, dim=-1))
        self.prefix.add_(1)

    def capture(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=side):
            self.step()

    def __call__(self) -> None:
        if self.graph is None:
            self.step()
        else:
            self.graph.replay()


class HostRead(RuntimeError):
    """A tensor value was read by the host inside a region that must not (``HostReads(refuse=True)``)."""


# Tensor methods / torch functions that hand a value to the host.
_READ_FUNCS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__",
               "numpy", "__array__", "nonzero", "equal", "is_nonzero", "argwhere", "unique",
               "unique_consecutive", "masked_select"}
# aten ops that do (below the torch-function level: from C++ paths and other entry points).
_READ_OPS = {"_local_scalar_dense", "nonzero", "equal", "is_nonzero", "masked_select", "unique_dim",
             "_unique", "_unique2", "unique_consecutive", "unique_dim_consecutive", "argwhere"}
_COPY_OPS = {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"}


# Torch functions that make a CPU tensor from Python values: reading it (or what is computed from
# such tensors alone) reads no device memory, so it is no host read of the round's state.
_HOST_MADE = {"tensor", "as_tensor", "scalar_tensor"}


def _tensors(args, kwargs) -> list:
    found = []

    def visit(x):
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y)
    visit(list(args) + list((kwargs or {}).values()))
    return found


def _devices(args, kwargs) -> set:
    return {t.device.type for t in _tensors(args, kwargs)}


def _shapes(out) -> tuple:
    if isinstance(out, torch.Tensor):
        return ((tuple(out.shape), str(out.dtype).removeprefix("torch.")),)
    if isinstance(out, (list, tuple)):
        return tuple(s for o in out for s in _shapes(o))
    return ()


class HostReads:
    """Counts (``refuse=False``) or refuses (``refuse=True``: raises :class:`HostRead`) host reads
    of tensor values inside the ``with`` block: the torch functions of ``_READ_FUNCS``, the aten
    ops of ``_READ_OPS``, boolean-mask indexing, copies between devices, and
    ``torch.cuda.synchronize`` / stream / event synchronisation. Reads of CPU tensors made inside
    the block from Python values (``torch.tensor(0.5)``, and what is computed from them alone)
    are not counted: they touch no device memory. The backends' kernels
    (what ``jetspec_kernels.backend.select`` returns) are opaque: on a GPU they are device work,
    and the reference backend's host reads on the CPU are its own business. With
    ``record_ops=True``, ``self.ops`` lists ``(op name, output shapes)`` of every aten op outside
    the kernels and ``("kernel:<fn>", output shapes)`` for each kernel call, in order.

    Attributes: ``reads`` (list of str, what was read, in order), ``ops``.
    """

    def __init__(self, refuse: bool = False, record_ops: bool = False):
        self.refuse, self.record_ops = refuse, record_ops
        self.reads: list[str] = []
        self.ops: list[tuple] = []
        self._opaque = 0
        self._in_read = 0
        self._host: dict[int, torch.Tensor] = {}
        guard = self

        class Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if guard._opaque or guard._in_read:
                    return func(*args, **(kwargs or {}))
                inputs = [t for t in _tensors(args, kwargs)]
                if name not in _READ_FUNCS:
                    out = func(*args, **(kwargs or {}))
                    if name in _HOST_MADE or (inputs and all(guard._is_host(t) for t in inputs)):
                        guard._mark_host(out)
                    return out
                if not (inputs and all(guard._is_host(t) for t in inputs)):
                    guard._read(f"torch function {name}")
                guard._in_read += 1
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    guard._in_read -= 1

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if guard._opaque:
                    return out
                name = func._schema.name.removeprefix("aten::")
                if not guard._in_read:
                    if name in _READ_OPS:
                        guard._read(f"aten op {name}")
                    elif name in _COPY_OPS and len(_devices(args, kwargs) | _devices((out,), None)) > 1:
                        guard._read(f"aten op {name} across devices")
                    elif name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                                 for i in args[1]):
                        guard._read("boolean-mask indexing")
                if guard.record_ops:
                    guard.ops.append((name, _shapes(out)))
                return out

        self._modes = (Functions(), Ops())

    def _is_host(self, t: torch.Tensor) -> bool:
        return id(t) in self._host and self._host[id(t)] is t

    def _mark_host(self, out) -> None:
        for t in _tensors((out,), None):
            if t.device.type == "cpu":
                self._host[id(t)] = t          # held until exit: ids stay unique

    def _read(self, what: str) -> None:
        if self.refuse:
            raise HostRead(f"host read inside a region that must not read: {what}")
        self.reads.append(what)

    def _opaque_select(self, select):
        guard = self

        def wrapped(device, fn, *args, **kwargs):
            impl = select(device, fn, *args, **kwargs)

            def run(*a, **k):
                guard._opaque += 1
                try:
                    out = impl(*a, **k)
                finally:
                    guard._opaque -= 1
                if guard.record_ops:
                    guard.ops.append((f"kernel:{fn}", _shapes(out)))
                return out
            return run
        return wrapped

    def _sync(self, what: str, real):
        guard = self

        def sync(*a, **k):
            if not guard._opaque:
                guard._read(what)
            return real(*a, **k)
        return sync

    def __enter__(self):
        from jetspec_kernels import backend
        self._patched = [(backend, "select", backend.select),
                         (torch.cuda, "synchronize", torch.cuda.synchronize),
                         (torch.cuda.Stream, "synchronize", torch.cuda.Stream.synchronize),
                         (torch.cuda.Event, "synchronize", torch.cuda.Event.synchronize)]
        backend.select = self._opaque_select(backend.select)
        for owner, attr, real in self._patched[1:]:
            setattr(owner, attr, self._sync(f"{owner.__name__}.{attr}", real))
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)
        for owner, attr, real in self._patched:
            setattr(owner, attr, real)
        return False


def kernel_launches(ops: list[tuple]) -> int:
    """Ops of a ``HostReads(record_ops=True)`` record that launch device work: aten ops other than
    views, allocations and metadata, plus one per backend kernel call (a lower bound for the
    kernels; the cuda attention may add a split reduction)."""
    free = {"empty", "empty_like", "empty_strided", "new_empty", "view", "_unsafe_view", "expand",
            "slice", "select", "unsqueeze", "squeeze", "permute", "transpose", "t", "as_strided",
            "alias", "detach", "lift_fresh", "_reshape_alias", "reshape", "unbind", "split",
            "split_with_sizes", "chunk", "narrow", "view_as", "expand_as", "contiguous",
            "_local_scalar_dense", "resolve_conj", "resolve_neg"}
    return sum(1 for name, _ in ops if name.split(".")[0] not in free)


def wall(fn, cuda: bool) -> float:
    """Seconds of ``fn()`` with the device synchronised before and after."""
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0
