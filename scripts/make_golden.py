#!/usr/bin/env python3
"""Golden fixtures for agentd-models from Hugging Face transformers.

Builds small random-weight Qwen3 checkpoints with transformers'
Qwen3ForCausalLM (eager attention, float32), saves each as a Hugging Face
directory under --out, and records in golden.json, for several prompts:
the prefill logits (every position, for short prompts; the last otherwise)
and an 8-token greedy continuation with, per step, the chosen token, its
log-probability and the full logits row. The Rust tests compare against
these without Python. Run through scripts/make_golden.sh.
"""

import argparse
import json
import os

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

VOCAB = 512
MAX_POS = 128
PROMPT_LENS = [1, 15, 16, 17, 100]
NEW_TOKENS = 8
# Prompts up to this length store logits for every position.
ALL_POSITIONS_UP_TO = 17

# GQA ratios 4, 2 and 1; head_dim 16 and 32; tied and untied output heads.
MODELS = [
    dict(name="gqa4-tied", kv=1, head_dim=16, tied=True, inter=128, seed=1),
    dict(name="gqa2-untied", kv=2, head_dim=32, tied=False, inter=96, seed=2),
    dict(name="gqa1-untied", kv=4, head_dim=16, tied=False, inter=128, seed=3),
]


def build(spec):
    torch.manual_seed(spec["seed"])
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=spec["inter"],
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=spec["kv"],
        head_dim=spec["head_dim"],
        max_position_embeddings=MAX_POS,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=spec["tied"],
        # Wider than the default 0.02 so logits are well separated and greedy
        # choices do not hinge on float rounding.
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="eager",
    )
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Non-trivial norm weights, so a norm applied wrongly shows.
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return model


def f(xs):
    return [float("%.7g" % x) for x in xs]


def cases(model, seed):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in PROMPT_LENS:
        ids = torch.randint(3, VOCAB, (n,), generator=gen)
        with torch.no_grad():
            logits = model(ids[None]).logits[0]
            rows = logits if n <= ALL_POSITIONS_UP_TO else logits[-1:]
            seq = ids.clone()
            steps = []
            for _ in range(NEW_TOKENS):
                last = model(seq[None]).logits[0, -1]
                lp = torch.log_softmax(last.double(), dim=-1)
                tok = int(torch.argmax(last))
                steps.append(
                    dict(token=tok, logprob=float(lp[tok]), logits=f(last.tolist()))
                )
                seq = torch.cat([seq, torch.tensor([tok])])
        out.append(
            dict(
                input_ids=ids.tolist(),
                prefill_logits_all_positions=n <= ALL_POSITIONS_UP_TO,
                prefill_logits=[f(r.tolist()) for r in rows],
                greedy=steps,
            )
        )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for spec in MODELS:
        d = os.path.join(args.out, spec["name"])
        model = build(spec)
        model.save_pretrained(d, safe_serialization=True)
        golden = dict(
            model=spec["name"],
            transformers="%s" % __import__("transformers").__version__,
            torch=torch.__version__,
            cases=cases(model, 100 + spec["seed"]),
        )
        with open(os.path.join(d, "golden.json"), "w") as fh:
            json.dump(golden, fh, separators=(",", ":"))
            fh.write("\n")
        print("wrote", d)


if __name__ == "__main__":
    main()
