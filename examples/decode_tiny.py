"""Speculative decoding with real (tiny) models: the README's "Models and the decoding loop" with
the checkpoints shipped in the package (a byte-level Qwen3 target and its trained JetSpec head).

    python examples/decode_tiny.py
    python examples/decode_tiny.py --device cuda --dtype bfloat16 --budget 64

Decodes two prompts speculatively and autoregressively, prints both continuations and the
accepted lengths, and exits with status 1 unless the greedy outputs are identical (speculative
decoding is lossless).
"""
import argparse
import os

import torch

from jetspec_kernels.decode import generate, generate_ar
from jetspec_kernels.models import DraftHead, Qwen3
from jetspec_kernels.models.assets import TINY_DIR
from jetspec_kernels.models.byte_tokenizer import EOS_ID, decode, encode

PROMPTS = ["def fibonacci(n):\n    ", "import os\nimport sys\n\n\ndef main("]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--budget", type=int, default=16, help="tree nodes per round (root included)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)

    # Hugging Face-style checkpoint directories: config.json + safetensors.
    target = Qwen3.from_pretrained(os.path.join(TINY_DIR, "target"), dtype=dtype, device=args.device)
    head = DraftHead.from_pretrained(os.path.join(TINY_DIR, "head_causal"), dtype=dtype,
                                     device=args.device)
    prompt_ids = [encode(text) for text in PROMPTS]        # one list of token ids per sequence
    kw = dict(max_new_tokens=args.max_new_tokens, eos_token_id=EOS_ID)
    spec = generate(target, head, prompt_ids, budget=args.budget, topk=8, temperature=0.0, **kw)
    base = generate_ar(target, prompt_ids, **kw)

    for text, tokens in zip(PROMPTS, spec.tokens):
        print(f"--- {text!r}\n{decode(tokens)!r}")
    stats = spec.stats
    print(f"speculative: {stats.rounds} rounds for {stats.new_tokens} tokens, mean accepted "
          f"length {stats.mean_accept:.2f}, accept histogram {stats.accept_histogram}")
    same = spec.tokens == base.tokens
    print("greedy outputs " + ("identical to autoregressive decoding" if same else
                               "DIFFER from autoregressive decoding"))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
