"""The block primitives of csrc/include/jetspec/primitives, each tested once on the simulator
through the test-only launchers of tests/cuda_sim/primitives.cpp: every thread gets the right
answer, also when consecutive calls share one scratch array, at 64, 256 and 512 threads. The ops
that use them (build_tree, log_softmax_topk, verify_tree) have their own tests in tests/ops/;
these reach what those inputs rarely do (every bit width and digit position of a radix select,
ties, keys left out, masses of zero)."""
import math
import random
import shutil

import pytest
import torch

THREADS = (64, 256, 512)


@pytest.fixture(scope="module")
def prims():
    if shutil.which("g++") is None:
        pytest.skip("the CUDA simulator needs g++")
    from cuda_sim.build import load
    return load("_primitives")


@pytest.mark.parametrize("threads", THREADS)
def test_block_reduce(prims, threads):
    gen = torch.Generator().manual_seed(threads)
    x = torch.randint(-(1 << 40), 1 << 40, (threads,), generator=gen)
    out = torch.full((threads, 6), -7, dtype=torch.int64)
    prims.block_reduce(threads, x.data_ptr(), out.data_ptr())
    want = torch.tensor([x.min(), x.max(), x.sum(), x.min(), (-x).min(), (x ^ 5).min()])
    assert torch.equal(out, want.expand(threads, 6))


@pytest.mark.parametrize("threads", THREADS)
def test_block_best(prims, threads):
    """Larger value first, ties to the lower index; the best value is tied three times."""
    gen = torch.Generator().manual_seed(threads)
    v = torch.randint(-50, 50, (threads,), generator=gen).float()
    i = torch.randperm(threads, generator=gen).int() * 3
    top = v.max()
    v[torch.randperm(threads, generator=gen)[:3]] = top + 1
    out_v = torch.full((threads, 3), float("nan"))
    out_i = torch.full((threads, 3), -7, dtype=torch.int32)
    prims.block_best(threads, v.data_ptr(), i.data_ptr(), out_v.data_ptr(), out_i.data_ptr())
    best = v == top + 1
    assert torch.all(out_v == top + 1)
    assert torch.all(out_i == i[best].min())


@pytest.mark.parametrize("threads", THREADS)
def test_block_scan(prims, threads):
    gen = torch.Generator().manual_seed(threads)
    x = torch.randint(-1000, 1000, (threads,), generator=gen)
    out = torch.full((threads, 3), -7, dtype=torch.int64)
    prims.block_scan(threads, x.data_ptr(), out.data_ptr())
    warp_inclusive = x.view(-1, 32).cumsum(1).view(-1)
    exclusive = x.cumsum(0) - x
    assert torch.equal(out[:, 0], warp_inclusive)
    assert torch.equal(out[:, 1], exclusive)
    assert torch.equal(out[:, 2], 2 * exclusive)


def select_spec(keys, masses, take, by_mass, target, share):
    """radix_select's contract by brute force over Python ints: (key, above_count, above_mass,
    equal_count, equal_mass, target)."""
    pairs = [(k, m) for k, m, t in zip(keys, masses, take) if t]
    weight = (lambda m: m) if by_mass else (lambda m: 1)
    if target == 0:
        target = max(1, math.ceil(share * float(sum(weight(m) for _, m in pairs))))
    for c in sorted({k for k, _ in pairs}, reverse=True):
        if sum(weight(m) for k, m in pairs if k >= c) >= target:
            break
    above = [m for k, m in pairs if k > c]
    equal = [m for k, m in pairs if k == c]
    return c, len(above), sum(above), len(equal), sum(equal), target


def run_select(prims, threads, key_bytes, with_mass, keys, masses, take, nbits, by_mass,
               target=0, share=0.0):
    """keys: Python ints below 2 ** nbits -> (every thread's key, [two calls' result fields])."""
    bits = 8 * key_bytes
    signed = [k - (1 << bits) if k >= 1 << (bits - 1) else k for k in keys]  # same bytes
    key_t = torch.tensor(signed, dtype=torch.int32 if key_bytes == 4 else torch.int64)
    mass_t = torch.tensor(masses, dtype=torch.int64)
    take_t = torch.tensor(take, dtype=torch.int8)
    per_thread = torch.full((threads,), -7, dtype=torch.int64)
    fields = torch.full((2, 6), -7, dtype=torch.int64)
    prims.radix_select(threads, key_bytes, with_mass, key_t.data_ptr(), mass_t.data_ptr(),
                       take_t.data_ptr(), len(keys), nbits, by_mass, target, share,
                       per_thread.data_ptr(), fields.data_ptr())
    mask = (1 << 64) - 1
    return ([int(k) & mask for k in per_thread],
            [tuple(int(f) & mask for f in row) for row in fields])


CASES = [  # (key bytes, masses kept, nbits, distinct keys?)
    (4, True, 32, False), (4, True, 13, False), (4, True, 5, False), (4, True, 9, True),
    (8, True, 61, True), (8, False, 61, True), (8, False, 64, True), (8, False, 40, False),
    (8, False, 8, False),
]


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("key_bytes,with_mass,nbits,distinct", CASES)
def test_radix_select(prims, threads, key_bytes, with_mass, nbits, distinct):
    """Count and mass selects at the top, the bottom and in between of random keys (ties unless
    distinct, keys left out, masses of zero), and a target from a share of the total."""
    rng = random.Random(threads * 1000 + nbits)
    n = min(700, (1 << nbits) // 2)
    if distinct:
        keys = set()
        while len(keys) < n:
            keys.add(rng.getrandbits(nbits))
        keys = sorted(keys, key=lambda _: rng.random())
    else:  # few distinct values, the extremes among them: most keys tie
        values = [rng.randrange(1 << nbits) for _ in range(9)] + [(1 << nbits) - 1, 0]
        keys = [rng.choice(values) for _ in range(n)]
    if with_mass:
        masses = [rng.randrange(1 << 40) if rng.random() < 0.8 else 0 for _ in range(n)]
    else:
        masses = [0] * n
    take = [int(rng.random() < 0.9) for _ in range(n)]
    taken = sum(take)
    total_mass = sum(m for m, t in zip(masses, take) if t)
    requests = [(False, 1, 0.0), (False, taken, 0.0), (False, taken // 3, 0.0),
                (False, 0, 0.37)]
    if with_mass:
        requests += [(True, 1, 0.0), (True, total_mass, 0.0), (True, total_mass // 2, 0.0),
                     (True, 0, 0.9)]
    for by_mass, target, share in requests:
        want = select_spec(keys, masses, take, by_mass, target, share)
        per_thread, fields = run_select(prims, threads, key_bytes, with_mass, keys, masses, take,
                                        nbits, by_mass, target, share)
        assert fields[0] == want, (by_mass, target, share)
        assert fields[1] == want  # a second call on the same shared memory
        assert per_thread == [want[0]] * threads


@pytest.mark.parametrize("threads", (64, 512))
def test_radix_select_one_key_value(prims, threads):
    """Every key equal (and a single key): the select returns it, all keys at it."""
    for n in (1, 300):
        keys, masses, take = [0xABCDE] * n, [3] * n, [1] * n
        for by_mass, target in ((False, n), (True, 2), (False, 1)):
            want = select_spec(keys, masses, take, by_mass, target, 0.0)
            assert want[0] == 0xABCDE
            per_thread, fields = run_select(prims, threads, 4, True, keys, masses, take, 20,
                                            by_mass, target)
            assert fields == [want, want]
            assert per_thread == [0xABCDE] * threads
