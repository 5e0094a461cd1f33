"""Bad arguments to ``generate`` / ``generate_ar`` raise TypeError (wrong type) or ValueError
naming the argument, before any model work; a draft head made for another target is refused."""
import pytest
import torch

from jetspec_kernels.decode import generate, generate_ar
from jetspec_kernels.models import tiny_models

pytestmark = pytest.mark.usefixtures("reference_backend")

V = 97   # the tiny models' vocabulary


@pytest.fixture(scope="module")
def models():
    return tiny_models(seed=0)


# Arguments both functions take: (keyword, value, exception, pattern the message must match).
SHARED = [
    ("temperature", -0.5, ValueError, "temperature"),
    ("temperature", float("nan"), ValueError, "temperature"),
    ("temperature", float("inf"), ValueError, "temperature"),
    ("temperature", "0.5", TypeError, "temperature"),
    ("temperature", None, TypeError, "temperature"),
    ("temperature", True, TypeError, "temperature"),
    ("max_new_tokens", 0, ValueError, "max_new_tokens"),
    ("max_new_tokens", -2, ValueError, "max_new_tokens"),
    ("max_new_tokens", 2.0, TypeError, "max_new_tokens"),
    ("prompt_ids", [[1, V]], ValueError, r"prompt_ids\[0\]\[1\] = 97 is outside.*\[0, 97\)"),
    ("prompt_ids", [[2], [3, -1]], ValueError, r"prompt_ids\[1\]\[1\] = -1"),
    ("prompt_ids", [], ValueError, "prompt_ids"),
    ("prompt_ids", [[1], []], ValueError, r"prompt_ids\[1\] is empty"),
    ("prompt_ids", "1 2 3", TypeError, "prompt_ids"),
    ("prompt_ids", [1, 2, 3], TypeError, r"prompt_ids\[0\]"),
    ("prompt_ids", [[1.0, 2]], TypeError, r"prompt_ids\[0\]\[0\]"),
    ("prompt_ids", [[1, 2.7]], TypeError, r"prompt_ids\[0\]\[1\]"),
    ("prompt_ids", [["a"]], TypeError, r"prompt_ids\[0\]\[0\]"),
    ("prompt_ids", [[True, 2]], TypeError, r"prompt_ids\[0\]\[0\]"),
    ("prompt_ids", [torch.tensor([1, 2])], TypeError, r"prompt_ids\[0\]"),
    ("eos_token_id", V, ValueError, "eos_token_id"),
    ("eos_token_id", -1, ValueError, "eos_token_id"),
    ("eos_token_id", [3, 500], ValueError, "eos_token_id"),
    ("eos_token_id", [], ValueError, "eos_token_id"),
    ("eos_token_id", "3", TypeError, "eos_token_id"),
    ("eos_token_id", [3, 1.0], TypeError, "eos_token_id"),
    ("page_size", 0, ValueError, "page_size"),
    ("page_size", 2.5, TypeError, "page_size"),
    ("seed", "1", TypeError, "seed"),
    ("seed", 2 ** 64, ValueError, "seed"),
]

# Arguments only the speculative loop takes.
SPECULATIVE = [
    ("budget", 0, ValueError, "budget"),
    ("budget", -4, ValueError, "budget"),
    ("budget", 5000, ValueError, "budget"),
    ("budget", 2.5, TypeError, "budget"),
    ("budget", "8", TypeError, "budget"),
    ("budget", True, TypeError, "budget"),
    ("topk", 0, ValueError, "topk"),
    ("topk", 65, ValueError, "topk"),
    ("topk", 2.0, TypeError, "topk"),
    ("topk", None, TypeError, "topk"),
    ("algorithm", "beam", ValueError, "algorithm"),
    ("sync_every", 0, ValueError, "sync_every"),
    ("sync_every", 1.5, TypeError, "sync_every"),
    ("fused_draft", "no", TypeError, "fused_draft"),
    ("cuda_graphs", 1, TypeError, "cuda_graphs"),
]


def _call(fn, models, **override):
    target, head = models
    kw = dict(prompt_ids=[[1, 2, 3]], max_new_tokens=2)
    kw.update(override)
    if fn is generate:
        return generate(target, head, **kw)
    return generate_ar(target, **kw)


@pytest.mark.parametrize("fn", [generate, generate_ar], ids=["generate", "generate_ar"])
@pytest.mark.parametrize("name,value,exc,pattern", SHARED, ids=[f"{a[0]}={a[1]!r}" for a in SHARED])
def test_shared_arguments(models, fn, name, value, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(fn, models, **{name: value})


@pytest.mark.parametrize("name,value,exc,pattern", SPECULATIVE,
                         ids=[f"{a[0]}={a[1]!r}" for a in SPECULATIVE])
def test_speculative_arguments(models, name, value, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(generate, models, **{name: value})


def test_good_arguments_still_run(models):
    """The accepted forms: numpy-free ints, a tuple prompt, an int or list EOS, int temperature."""
    target, head = models
    a = generate(target, head, [(1, 2, 3)], max_new_tokens=3, budget=4, topk=2, temperature=0,
                 eos_token_id=[96])
    b = generate_ar(target, [[1, 2, 3]], max_new_tokens=3, eos_token_id=96)
    assert a.tokens == b.tokens and len(a.tokens[0]) >= 1


# Draft heads that do not fit the 2-layer, hidden-64, 97-token tiny target.
MISMATCHED_HEADS = [
    ({"target_hidden_size": 32}, "target_hidden_size"),
    ({"hidden_size": 32}, "hidden_size 32"),
    ({"vocab_size": 50, "mask_token_id": 49}, "vocab_size 50"),
    ({"mask_token_id": 97}, "mask_token_id 97"),
    ({"target_layer_ids": [2]}, r"target_layer_ids \[2\]"),
    ({"target_layer_ids": [0, -1]}, r"target_layer_ids \[-1\]"),
    ({"num_target_layers": 4}, "4-layer target"),
]


@pytest.mark.parametrize("overrides,pattern", MISMATCHED_HEADS, ids=[str(o) for o, _ in MISMATCHED_HEADS])
def test_head_that_does_not_fit_the_target(models, overrides, pattern):
    target, _ = models
    _, head = tiny_models(seed=0, draft_overrides=overrides)
    with pytest.raises(ValueError, match=f"^head: .*{pattern}"):
        generate(target, head, [[1, 2, 3]], max_new_tokens=2)


def test_head_on_another_device(models):
    target, _ = models
    _, head = tiny_models(seed=0, device="meta")
    with pytest.raises(ValueError, match="^head: .*meta"):
        generate(target, head, [[1, 2, 3]], max_new_tokens=2)


@pytest.mark.parametrize("given, expected", [(None, False), (False, False)])
def test_checked_arguments_resolve_cuda_graphs(models, given, expected):
    """generate's one argument check also settles cuda_graphs: the default (None) is off on a CPU
    target, whatever the backend."""
    from jetspec_kernels.decode.arguments import checked_generate_args
    target, head = models
    args = checked_generate_args(target, head, [[1, 2, 3]], max_new_tokens=2, cuda_graphs=given)
    assert args.cuda_graphs is expected


# ---- the group check, one field at a time, in one process (tests/test_tp.py: on real groups) --
def _model_on(shard):
    from types import SimpleNamespace
    return SimpleNamespace(shard=shard)


@pytest.mark.parametrize("field,shard", [
    ("size", (None, 0, 2)), ("rank", (None, 1, 1)), ("group", ("another group", 0, 1)),
], ids=["size", "rank", "group"])
def test_check_group_refuses_a_model_differing_in_one_field(field, shard):
    """Run alone (no process group): a model whose shard differs from tp.ALONE in only its size,
    only its rank or only its process group is refused, naming group; tp.ALONE itself passes."""
    from jetspec_kernels import tp
    from jetspec_kernels.decode.arguments import check_group
    assert check_group(None, target=_model_on(tp.ALONE)) is tp.ALONE
    with pytest.raises(ValueError, match=r"^group: the target is split over"):
        check_group(None, target=_model_on(tp.Shard(*shard)))


@pytest.mark.parametrize("rank,size", [(0, 2), (1, 1), (1, 2)])
def test_a_shard_without_a_group_must_be_alone(rank, size):
    """A Shard with no process group claiming another rank or size than 0 of 1 is refused where
    it is given (generate's group=, a model's group=), naming group."""
    from jetspec_kernels import tp
    with pytest.raises(ValueError, match=rf"^group: the Shard says rank {rank} of {size}"):
        tp.shard_of(tp.Shard(None, rank, size))
    assert tp.shard_of(tp.Shard(None, 0, 1)) == tp.ALONE
