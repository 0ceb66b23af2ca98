#!/usr/bin/env python3
"""Golden fixtures for agentd-models from Hugging Face transformers.

Builds small random-weight checkpoints of every family agentd runs with
transformers (Qwen3ForCausalLM, Glm4ForCausalLM, Qwen3MoeForCausalLM,
Glm4MoeForCausalLM; eager attention, float32), saves each as a Hugging Face
directory under --out, and records in golden.json, for several prompts:
the prefill logits (every position, for short prompts; the last otherwise)
and an 8-token greedy continuation with, per step, the chosen token, its
log-probability and the full logits row. The Rust tests compare against
these without Python. Run through scripts/make_golden.sh; `--only NAME ...`
regenerates some fixtures and leaves the others as they are.
"""

import argparse
import json
import os

import torch
from transformers import (
    Glm4Config,
    Glm4ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

VOCAB = 512
MAX_POS = 128
PROMPT_LENS = [1, 15, 16, 17, 100]
NEW_TOKENS = 8
# Prompts up to this length store logits for every position.
ALL_POSITIONS_UP_TO = 17

# GQA ratios 4, 2 and 1; head_dim 16 and 32; tied and untied output heads.
# Per family: `extra` are the family's own config fields; `bias` sets
# GLM-4.5's e_score_correction_bias per sparse layer (a large entry forces
# every token onto that expert).
MODELS = [
    dict(name="gqa4-tied", kv=1, head_dim=16, tied=True, inter=128, seed=1),
    dict(name="gqa2-untied", kv=2, head_dim=32, tied=False, inter=96, seed=2),
    dict(name="gqa1-untied", kv=4, head_dim=16, tied=False, inter=128, seed=3),
    # GLM-4-0414: q/k/v bias, half of each head rotated (interleaved pairs).
    dict(name="glm4-gqa2", family="glm4", kv=2, head_dim=32, tied=False, inter=96, seed=4),
    dict(name="glm4-gqa1-tied", family="glm4", kv=4, head_dim=16, tied=True, inter=128, seed=5),
    # Qwen3-MoE: 8 experts, top 2; layer 1 dense through mlp_only_layers /
    # layer 0 dense through decoder_sparse_step.
    dict(
        name="qwen3moe-gqa2", family="qwen3_moe", kv=2, head_dim=32, tied=False, inter=96,
        seed=6, layers=3,
        extra=dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1]),
    ),
    dict(
        name="qwen3moe-gqa1-tied", family="qwen3_moe", kv=4, head_dim=16, tied=True,
        inter=128, seed=7,
        extra=dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=48,
                   norm_topk_prob=False, decoder_sparse_step=2),
    ),
    # GLM-4.5: grouped sigmoid router with scaling, shared expert, first layer
    # dense, q/k norm, partial neox RoPE.
    dict(
        name="glm4moe-gqa2", family="glm4_moe", kv=2, head_dim=32, tied=False, inter=96,
        seed=8, layers=3,
        extra=dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                   n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                   n_shared_experts=1, first_k_dense_replace=1, use_qk_norm=True,
                   attention_bias=True),
        bias="random",
    ),
    # Every token on expert 2 (top-1, a bias no score can beat); no norm.
    dict(
        name="glm4moe-gqa1-tied", family="glm4_moe", kv=4, head_dim=16, tied=True,
        inter=128, seed=9,
        extra=dict(n_routed_experts=4, num_experts_per_tok=1, moe_intermediate_size=48,
                   n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False,
                   n_shared_experts=2, first_k_dense_replace=0, use_qk_norm=False,
                   attention_bias=False),
        bias="expert2",
    ),
]

FAMILIES = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "glm4": (Glm4Config, Glm4ForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "glm4_moe": (Glm4MoeConfig, Glm4MoeForCausalLM),
}


def build(spec):
    torch.manual_seed(spec["seed"])
    config_cls, model_cls = FAMILIES[spec.get("family", "qwen3")]
    config = config_cls(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=spec["inter"],
        num_hidden_layers=spec.get("layers", 2),
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
        # GLM's default pad id (151329) is outside the tiny vocabulary.
        pad_token_id=None,
        attn_implementation="eager",
        **spec.get("extra", {}),
    )
    model = model_cls(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Non-trivial norm weights, so a norm applied wrongly shows.
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            # Biases are zero at init; make them show too.
            if name.endswith("_proj.bias"):
                p.copy_(0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                if spec.get("bias") == "random":
                    b.copy_(0.2 * torch.randn_like(b))
                elif spec.get("bias") == "expert2":
                    b.zero_()
                    b[2] = 10.0
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
    ap.add_argument("--only", nargs="*", help="fixture names to regenerate")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for spec in MODELS:
        if args.only and spec["name"] not in args.only:
            continue
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
