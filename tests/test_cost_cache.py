"""The round-cost cache on disk: hits, a miss on every key field, --no-cache, a corrupt file
ignored with a warning, and what ``jetspec generate --budget auto`` prints about it."""
import json
import os
import warnings

import pytest

import jetspec_kernels.decode as decode_mod
from jetspec_kernels.__main__ import main as package_main
from jetspec_kernels.adaptive import CostModel
from jetspec_kernels.adaptive.cost_cache import (cache_dir, checkpoint_identity, config_identity,
                                                 cost_file, load_costs, store_costs)
from jetspec_kernels.models.tiny import tiny_qwen3_config

KEY = {"package": "0.1.0", "torch": "2.13.0", "weights": {"target": {"path": "/m", "files": []}},
       "target_config": "abc", "head_config": "def", "device": "cpu X, 2 threads",
       "dtype": "float32", "batch": 1, "sizes": [4, 8], "topk": 3, "greedy": True,
       "page_size": None, "tp": 1, "tp_rank": 0, "backends": ["reference"]}
MODEL = CostModel({4: 0.002, 8: 0.003})


def test_store_then_load(tmp_path):
    path = store_costs(KEY, MODEL, tmp_path)
    assert path == cost_file(KEY, tmp_path) and path.parent == tmp_path
    assert load_costs(dict(KEY), tmp_path).costs == MODEL.costs
    assert [p.name for p in tmp_path.iterdir()] == [path.name]       # no temporary file left


@pytest.mark.parametrize("field,value", [
    ("package", "0.2.0"), ("torch", "2.12.0"), ("weights", {"target": {"path": "/n", "files": []}}),
    ("target_config", "abd"), ("head_config", "deg"), ("device", "NVIDIA H100"),
    ("dtype", "bfloat16"), ("batch", 2), ("sizes", [4, 8, 16]), ("topk", 4), ("greedy", False),
    ("page_size", 16), ("tp", 2), ("tp_rank", 1), ("backends", ["triton"]),
])
def test_a_change_in_any_key_field_is_a_miss(tmp_path, field, value):
    store_costs(KEY, MODEL, tmp_path)
    assert load_costs({**KEY, field: value}, tmp_path) is None


def test_a_file_under_another_key_is_a_miss(tmp_path):
    """The stored key is compared, not just the file name's hash."""
    path = store_costs(KEY, MODEL, tmp_path)
    stored = json.loads(path.read_text())
    stored["key"]["batch"] = 7
    path.write_text(json.dumps(stored))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_costs(KEY, tmp_path) is None


@pytest.mark.parametrize("text", ["{not json", '{"format": 1, "key": null}', "[]",
                                  '{"format": 1, "key": KEY, "costs": {"4": -1.0}}',
                                  '{"format": 1, "key": KEY, "costs": {"four": 1.0}}',
                                  '{"format": 1, "key": KEY}'])
def test_a_corrupt_file_is_ignored_with_a_warning(tmp_path, text):
    path = cost_file(KEY, tmp_path)
    path.write_text(text.replace("KEY", json.dumps(KEY)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_costs(KEY, tmp_path) is None
    if text != '{"format": 1, "key": null}':        # a well-formed file of another key: a miss
        assert len(caught) == 1 and str(path) in str(caught[0].message)


def test_store_needs_measured_sizes(tmp_path):
    with pytest.raises(TypeError, match="callable"):
        store_costs(KEY, CostModel(lambda n: 1e-3 * n), tmp_path)


def test_cache_dir_follows_xdg():
    assert str(cache_dir({"XDG_CACHE_HOME": "/x/cache"})) == "/x/cache/jetspec_kernels"
    assert cache_dir({}) == cache_dir({"XDG_CACHE_HOME": ""})
    assert str(cache_dir({})).endswith(os.path.join(".cache", "jetspec_kernels"))


def test_identities(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    first = checkpoint_identity(str(tmp_path))
    assert first["path"] == str(tmp_path.resolve()) and first["files"][0][:2] == ["model.safetensors", 10]
    os.utime(tmp_path / "model.safetensors", ns=(1, 1))
    assert checkpoint_identity(str(tmp_path)) != first               # a re-saved checkpoint
    cfg = tiny_qwen3_config()
    assert config_identity(cfg) == config_identity(tiny_qwen3_config())
    assert config_identity(cfg) != config_identity(tiny_qwen3_config(num_hidden_layers=3))


# --- the CLI ------------------------------------------------------------------------------------

@pytest.fixture
def measured(monkeypatch, tmp_path):
    """Counts measure_round_costs calls (returning a fixed model) and points the cache at tmp."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    calls = []

    def fake(target, head, prompt_ids, sizes, **kw):
        calls.append((len(prompt_ids), tuple(sizes)))
        return CostModel({n: 1e-3 * (1 + n / 8) for n in sizes})

    monkeypatch.setattr(decode_mod, "measure_round_costs", fake)
    return calls


def _generate(*extra):
    return package_main(["generate", "--random-tiny", "--prompt", "1 2 3", "--max-new-tokens", "4",
                         "--topk", "3", "--backend", "reference", *extra])


def test_cli_measures_once_then_reads_the_cache(measured, capsys, tmp_path):
    assert _generate("--budget", "4,8") == 0
    out = capsys.readouterr().out
    assert measured == [(1, (4, 8))]
    assert "[budget] measuring the round costs of tree sizes 4, 8" in out
    assert f"kept in {tmp_path / 'xdg' / 'jetspec_kernels'}" in out
    assert "4: 1.5 ms, 8: 2 ms" in out and "tree sizes chosen: " in out
    assert _generate("--budget", "4,8") == 0
    out = capsys.readouterr().out
    assert measured == [(1, (4, 8))] and "round costs read from" in out and "--no-cache" in out
    assert _generate("--budget", "4,8", "--no-cache") == 0
    assert len(measured) == 2 and "measuring the round costs" in capsys.readouterr().out


@pytest.mark.parametrize("change", [["--prompt", "4 5"], ["--dtype", "bfloat16"], ["--topk", "2"],
                                    ["--budget", "4,16"], ["--temperature", "0.5"],
                                    ["--page-size", "4"], ["--exact"]])
def test_cli_miss_on_what_changes_a_round(measured, capsys, change):
    assert _generate("--budget", "4,8") == 0
    argv = ["--budget", "4,8", *change] if change[0] != "--budget" else change
    assert _generate(*argv) == 0
    assert len(measured) == 2, change


def test_cli_corrupt_cache_file_warns_and_measures(measured, capsys, tmp_path):
    assert _generate("--budget", "4,8") == 0
    (path,) = (tmp_path / "xdg" / "jetspec_kernels").iterdir()
    path.write_text("{truncated")
    with pytest.warns(RuntimeWarning, match="ignoring the cached round costs"):
        assert _generate("--budget", "4,8") == 0
    assert len(measured) == 2
    assert json.loads(path.read_text())["costs"] == {"4": 0.0015, "8": 0.002}   # replaced whole


def test_cli_fixed_budget_reads_no_costs(measured, capsys, tmp_path):
    assert _generate("--budget", "8") == 0
    out = capsys.readouterr().out
    assert measured == [] and "[budget]" not in out and "tree sizes chosen" not in out
    assert not (tmp_path / "xdg").exists()


def test_cli_measures_exact_rounds_in_the_exact_mode(monkeypatch, tmp_path, capsys):
    """--exact --budget a,b: the round costs are measured with the target in the exact mode (the
    rounds that will run), under their own cache key (the GEMM tile included)."""
    from jetspec_kernels.ops import exact as ex
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    seen = []

    def fake(target, head, prompt_ids, sizes, **kw):
        seen.append(ex.exact_enabled())
        return CostModel({n: 1e-3 * (1 + n / 8) for n in sizes})

    monkeypatch.setattr(decode_mod, "measure_round_costs", fake)
    assert _generate("--budget", "4,8", "--exact") == 0
    assert _generate("--budget", "4,8", "--exact", "--exact-tile", "wide") == 0
    assert _generate("--budget", "4,8") == 0
    assert seen == [True, True, False]
