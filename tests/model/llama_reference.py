#!/usr/bin/env python3
"""Independent reference for memprofd's Llama model (tests/model/llama_test.cc).

Usage: llama_reference.py DIR

DIR holds config.json (a Hugging Face Llama config), manifest.json
({"tensors": [{"name", "shape", "file"}], "input_ids": {"shape", "file"}}),
the raw little-endian tensors it names (float32 weights, int64 ids), and
receives logits.bin: float32 logits [B, T, vocab_size].

The equations are written out here from the transformers LlamaForCausalLM
definition, without sharing code with the C++ model: RMSNorm in float32,
rotary embedding pairing dimension i with i + head_dim/2 (rotate_half),
query head h reading key/value head h // (heads / kv_heads), causal softmax
attention scaled by 1/sqrt(head_dim), SwiGLU MLP down(silu(gate x) * up x).
"""

import json
import math
import os
import sys

import numpy as np
import torch


def load(directory):
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    weights = {}
    for t in manifest["tensors"]:
        data = np.fromfile(os.path.join(directory, t["file"]), dtype="<f4")
        weights[t["name"]] = torch.from_numpy(data.reshape(t["shape"]).copy())
    ids_spec = manifest["input_ids"]
    ids = np.fromfile(os.path.join(directory, ids_spec["file"]), dtype="<i8")
    return cfg, weights, torch.from_numpy(ids.reshape(ids_spec["shape"]).copy())


def rms_norm(x, weight, eps):
    variance = (x * x).mean(dim=-1, keepdim=True)
    return weight * (x / torch.sqrt(variance + eps))


def rotary_tables(seq_len, head_dim, theta):
    # transformers computes the angles in float32; so does this.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    angles = torch.arange(seq_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cos(angles), torch.sin(angles)  # [T, head_dim / 2] each


def rotate(x, cos, sin):
    # x: [B, T, head_dim]; the pair (x[i], x[i + d/2]) turns by angle[i].
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def forward(cfg, w, ids):
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = hidden // heads
    eps = cfg["rms_norm_eps"]
    batch, seq = ids.shape
    cos, sin = rotary_tables(seq, head_dim, cfg["rope_theta"])
    allowed = torch.tril(torch.ones(seq, seq, dtype=torch.bool))

    x = w["model.embed_tokens.weight"][ids]  # [B, T, H]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = h @ w[p + "self_attn.q_proj.weight"].t()
        k = h @ w[p + "self_attn.k_proj.weight"].t()
        v = h @ w[p + "self_attn.v_proj.weight"].t()
        outputs = []
        for head in range(heads):
            group = head // (heads // kv_heads)
            qs = slice(head * head_dim, (head + 1) * head_dim)
            ks = slice(group * head_dim, (group + 1) * head_dim)
            qh = rotate(q[..., qs], cos, sin)
            kh = rotate(k[..., ks], cos, sin)
            vh = v[..., ks]
            scores = (qh @ kh.transpose(1, 2)) / math.sqrt(head_dim)
            scores = scores.masked_fill(~allowed, float("-inf"))
            outputs.append(torch.softmax(scores, dim=-1) @ vh)
        attn = torch.cat(outputs, dim=-1)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].t()
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].t()
        up = h @ w[p + "mlp.up_proj.weight"].t()
        x = x + (gate * torch.sigmoid(gate) * up) @ w[p + "mlp.down_proj.weight"].t()
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight")
    if head is None or cfg.get("tie_word_embeddings"):
        head = w["model.embed_tokens.weight"]
    return x @ head.t()


def main():
    directory = sys.argv[1]
    cfg, weights, ids = load(directory)
    assert cfg["architectures"] == ["LlamaForCausalLM"], cfg["architectures"]
    assert cfg["model_type"] == "llama" and cfg["hidden_act"] == "silu"
    with torch.no_grad():
        logits = forward(cfg, weights, ids)
    logits.numpy().astype("<f4").tofile(os.path.join(directory, "logits.bin"))
    print("reference logits", tuple(logits.shape), "torch", torch.__version__)


if __name__ == "__main__":
    main()
