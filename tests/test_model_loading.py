"""Loading checkpoints: a missing directory, config.json or weights file, an unreadable file, a
missing, misshapen or unused tensor, and config fields the models do not implement (or of the
wrong type) raise CheckpointError naming the directory, file, field or tensor."""
import json
import os

import pytest
import torch

from jetspec_kernels.models import CheckpointError, DraftHead, Qwen3, save_draft_head, save_qwen3
from jetspec_kernels.models.checkpoint import load_safetensors, save_safetensors
from jetspec_kernels.models.tiny import (random_draft_weights, random_qwen3_weights, tiny_draft_config,
                                         tiny_qwen3_config)

LOADERS = {"target": Qwen3.from_pretrained, "head": DraftHead.from_pretrained}


def _save(kind, path, weights=None):
    """A tiny checkpoint of ``kind`` in ``path`` (random weights unless given); returns path."""
    tcfg = tiny_qwen3_config()
    if kind == "target":
        save_qwen3(tcfg, random_qwen3_weights(tcfg) if weights is None else weights, str(path))
    else:
        dcfg = tiny_draft_config(tcfg)
        save_draft_head(dcfg, random_draft_weights(dcfg) if weights is None else weights, str(path))
    return path


def _weights(kind):
    tcfg = tiny_qwen3_config()
    return random_qwen3_weights(tcfg) if kind == "target" else random_draft_weights(tiny_draft_config(tcfg))


def _edit_config(path, **changes):
    """Rewrite path/config.json with top-level ``changes`` (None deletes a key)."""
    with open(path / "config.json") as f:
        cfg = json.load(f)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(params=sorted(LOADERS))
def kind(request):
    return request.param


def test_valid_checkpoints_load(tmp_path, kind):
    model = LOADERS[kind](str(_save(kind, tmp_path / kind)))
    assert model.config.vocab_size == 97


def test_missing_directory(tmp_path, kind):
    missing = tmp_path / "nowhere"
    with pytest.raises(CheckpointError, match=f"{missing} does not exist"):
        LOADERS[kind](str(missing))


def test_missing_config(tmp_path, kind):
    path = _save(kind, tmp_path / kind)
    os.remove(path / "config.json")
    with pytest.raises(CheckpointError, match=f"no config.json in {path}"):
        LOADERS[kind](str(path))


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\xff\xfe"])
def test_unreadable_config(tmp_path, kind, text):
    path = _save(kind, tmp_path / kind)
    (path / "config.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(CheckpointError, match=str(path / "config.json")):
        LOADERS[kind](str(path))


def test_missing_weights_file(tmp_path, kind):
    path = _save(kind, tmp_path / kind)
    os.remove(path / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"no weights in {path}.*model.safetensors"):
        LOADERS[kind](str(path))


def test_corrupt_weights_file(tmp_path, kind):
    path = _save(kind, tmp_path / kind)
    (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    with pytest.raises(CheckpointError, match=str(path / "model.safetensors")):
        LOADERS[kind](str(path))


def test_unreadable_shard_index(tmp_path, kind):
    path = _save(kind, tmp_path / kind)
    os.remove(path / "model.safetensors")
    (path / "model.safetensors.index.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="model.safetensors.index.json"):
        LOADERS[kind](str(path))


def test_load_safetensors_missing_path(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_safetensors(str(tmp_path / "nowhere"))


# One tensor of each checkpoint, named as stored.
VICTIM = {"target": "model.layers.1.self_attn.k_norm.weight", "head": "layers.0.mlp.up_proj.weight"}


def test_missing_tensor(tmp_path, kind):
    w = _weights(kind)
    del w[VICTIM[kind]]
    path = _save(kind, tmp_path / kind, w)
    with pytest.raises(CheckpointError, match=rf"{path}: missing tensor '{VICTIM[kind]}'"):
        LOADERS[kind](str(path))


def test_tensor_of_wrong_shape(tmp_path, kind):
    w = _weights(kind)
    w[VICTIM[kind]] = torch.zeros(3, *w[VICTIM[kind]].shape)
    path = _save(kind, tmp_path / kind, w)
    with pytest.raises(CheckpointError, match=rf"'{VICTIM[kind]}' has shape \[3, "):
        LOADERS[kind](str(path))


@pytest.mark.parametrize("extra", ["layers.2.mlp.up_proj.weight", "layers.0.self_attn.q_proj.bias",
                                   "layers.x.mlp.up_proj.weight"])
def test_tensor_the_model_would_not_read(tmp_path, kind, extra):
    """An extra layer or a bias means config.json does not describe the weights."""
    name = ("model." if kind == "target" else "") + extra
    w = _weights(kind)
    w[name] = torch.zeros(4)
    path = _save(kind, tmp_path / kind, w)
    with pytest.raises(CheckpointError, match=rf"'{name}'"):
        LOADERS[kind](str(path))


def test_rotary_buffer_is_tolerated(tmp_path):
    w = _weights("target")
    w["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    Qwen3.from_pretrained(str(_save("target", tmp_path, w)))


def test_omitted_optional_fields_take_transformers_defaults(tmp_path):
    """A config.json without tie_word_embeddings or rms_norm_eps gets transformers' Qwen3Config
    defaults: an untied lm_head (read from lm_head.weight, not the embedding) and eps 1e-6."""
    w = _weights("target")
    path = _save("target", tmp_path, w)
    _edit_config(path, tie_word_embeddings=None, rms_norm_eps=None)
    model = Qwen3.from_pretrained(str(path))
    assert model.config.tie_word_embeddings is False and model.config.rms_norm_eps == 1e-6
    assert torch.equal(model.lm_head_weight.cpu(), w["lm_head.weight"].to(model.lm_head_weight.dtype))


# Config fields both loaders read: (changes, pattern naming the field).
UNSUPPORTED = [
    ({"model_type": "llama"}, "model_type 'llama'"),
    ({"model_type": "qwen3_moe"}, "model_type 'qwen3_moe'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'rope_scaling'.*'yarn'"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "'rope_scaling'.*'linear'"),
    ({"rope_scaling": "yarn"}, "'rope_scaling'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "'rope_parameters'.*'llama3'"),
    ({"hidden_act": "gelu"}, "'hidden_act' 'gelu'"),
    ({"use_sliding_window": True}, "'use_sliding_window'"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "'layer_types'.*sliding_attention"),
    ({"attention_bias": True}, "'attention_bias'"),
    ({"mlp_bias": True}, "'mlp_bias'"),
    ({"quantization_config": {"quant_method": "fp8"}}, "'quantization_config'"),
    ({"partial_rotary_factor": 0.5}, "'partial_rotary_factor'"),
    ({"tie_word_embeddings": "false"}, "'tie_word_embeddings'"),
    ({"hidden_size": "64"}, "'hidden_size'"),
    ({"vocab_size": 97.0}, "'vocab_size'"),
    ({"vocab_size": None}, "'vocab_size'"),
    ({"num_hidden_layers": 0}, "'num_hidden_layers'"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"head_dim": None, "num_attention_heads": 3, "num_key_value_heads": 3}, "'head_dim'"),
    ({"rms_norm_eps": -1e-6}, "'rms_norm_eps'"),
    ({"rope_theta": 0}, "'rope_theta'"),
]


@pytest.mark.parametrize("changes,pattern", UNSUPPORTED, ids=[str(c) for c, _ in UNSUPPORTED])
def test_unsupported_or_malformed_config(tmp_path, kind, changes, pattern):
    path = _save(kind, tmp_path / kind)
    _edit_config(path, **changes)
    with pytest.raises(CheckpointError, match=pattern) as info:
        LOADERS[kind](str(path))
    assert str(path / "config.json") in str(info.value)


# Draft-head fields: (changes to dflash_config, top-level changes, pattern).
BAD_HEAD_FIELDS = [
    ({"causal_head": "false"}, {}, "'causal_head'"),
    ({"target_layer_ids": "1"}, {}, "'dflash_config.target_layer_ids'"),
    ({"target_layer_ids": []}, {}, "'dflash_config.target_layer_ids'"),
    ({"target_layer_ids": [-1]}, {}, "'dflash_config.target_layer_ids'"),
    ({"target_layer_ids": [1.0]}, {}, "'dflash_config.target_layer_ids'"),
    ({"target_layer_ids": [2]}, {}, r"target_layer_ids \[2\] out of range for num_target_layers=2"),
    ({"mask_token_id": 97}, {}, "mask_token_id 97"),
    ({"mask_token_id": "96"}, {}, "'mask_token_id'"),
    ({"mask_token_id": None}, {}, "mask_token_id"),
    ({"target_hidden_size": 0}, {}, "'target_hidden_size'"),
    ({}, {"block_size": 1}, "'block_size'"),
    ({}, {"block_size": None}, "'block_size'"),
    ({}, {"dflash_config": [1]}, "'dflash_config'"),
]


@pytest.mark.parametrize("dflash,top,pattern", BAD_HEAD_FIELDS, ids=[str(c) for c in BAD_HEAD_FIELDS])
def test_bad_draft_head_fields(tmp_path, dflash, top, pattern):
    path = _save("head", tmp_path)
    with open(path / "config.json") as f:
        cfg = json.load(f)
    for k, v in dflash.items():
        if v is None:
            cfg["dflash_config"].pop(k)
        else:
            cfg["dflash_config"][k] = v
    (path / "config.json").write_text(json.dumps(cfg))
    _edit_config(path, **top)
    with pytest.raises(CheckpointError, match=pattern):
        DraftHead.from_pretrained(str(path))


def test_dflash_model_type_head_loads(tmp_path):
    path = _save("head", tmp_path)
    _edit_config(path, model_type="dflash", architectures=["DFlashDraftModel"])
    assert DraftHead.from_pretrained(str(path)).target_layer_ids == [1]


def test_sharded_checkpoint_with_a_missing_tensor(tmp_path):
    """The shards load together; a tensor absent from every shard is named."""
    w = _weights("target")
    del w["model.norm.weight"]
    tcfg = tiny_qwen3_config()
    save_qwen3(tcfg, w, str(tmp_path), max_shard_bytes=30_000)
    assert not os.path.exists(tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="'model.norm.weight'"):
        Qwen3.from_pretrained(str(tmp_path))
    save_safetensors({"x": torch.zeros(1)}, str(tmp_path / "other"))
    assert list(load_safetensors(str(tmp_path / "other"))) == ["x"]


def test_shards_fill_up_to_exactly_the_limit_and_keep_integer_dtypes(tmp_path):
    """Shards of at most max_shard_bytes: two 16-byte tensors fill a 32-byte shard exactly, the
    third starts the next. A dtype cast on loading applies to floating tensors only."""
    t = {"a": torch.ones(4), "b": torch.full((4,), 2.0), "c": torch.arange(2, dtype=torch.int64)}
    save_safetensors(t, str(tmp_path), max_shard_bytes=32)
    with open(tmp_path / "model.safetensors.index.json") as f:
        shard_of = json.load(f)["weight_map"]
    assert shard_of["a"] == shard_of["b"] != shard_of["c"]
    got = load_safetensors(str(tmp_path), dtype=torch.float16)
    assert got["a"].dtype == torch.float16 and torch.equal(got["b"], t["b"].half())
    assert got["c"].dtype == torch.int64 and torch.equal(got["c"], t["c"])
