#!/usr/bin/env python3
"""Python eager-mode baseline for bench/train_bench.cc.

The same Llama architecture as memprofd's model (RMSNorm, rotary embedding,
grouped-query causal attention, SwiGLU MLP, tied head) trained with the same
step (cross-entropy, backward, AdamW with the same parameter groups) on the
same shapes, in Debian's torch. Prints one JSON object per preset on stdout.

Usage: train_bench_eager.py --preset tiny [--preset small] --batch 8 --seq 128
       --warmup 2 --steps 10 [--threads N]
"""

import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F

PRESETS = {
    # Kept equal to LlamaConfig::Preset in core/model/config.cc.
    "tiny": dict(vocab=256, hidden=256, inter=1024, layers=4, heads=8, kv=4, pos=512),
    "small": dict(vocab=256, hidden=512, inter=1792, layers=8, heads=8, kv=8, pos=1024),
}


class Llama(torch.nn.Module):
    def __init__(self, p, eps=1e-5, theta=10000.0):
        super().__init__()
        self.p, self.eps = p, eps
        h, d = p["hidden"], p["hidden"] // p["heads"]
        self.head_dim = d

        def lin(o, i):
            return torch.nn.Parameter(torch.randn(o, i) * 0.02)

        self.embed = torch.nn.Parameter(torch.randn(p["vocab"], h) * 0.02)
        self.layers = torch.nn.ParameterList()
        for _ in range(p["layers"]):
            self.layers.extend([
                lin(p["heads"] * d, h), lin(p["kv"] * d, h), lin(p["kv"] * d, h),
                lin(h, p["heads"] * d), lin(p["inter"], h), lin(p["inter"], h),
                lin(h, p["inter"]),
                torch.nn.Parameter(torch.ones(h)), torch.nn.Parameter(torch.ones(h)),
            ])
        self.norm = torch.nn.Parameter(torch.ones(h))
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2).float() / d))
        freqs = torch.outer(torch.arange(p["pos"]).float(), inv_freq)
        emb = torch.cat([freqs, freqs], -1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def rms(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    @staticmethod
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], -1)

    def layer(self, i, x):
        q_w, k_w, v_w, o_w, g_w, u_w, d_w, n1, n2 = self.layers[9 * i:9 * i + 9]
        b, t, _ = x.shape
        nh, nkv, d = self.p["heads"], self.p["kv"], self.head_dim
        h = self.rms(x, n1)
        q = F.linear(h, q_w).view(b, t, nh, d).transpose(1, 2)
        k = F.linear(h, k_w).view(b, t, nkv, d).transpose(1, 2)
        v = F.linear(h, v_w).view(b, t, nkv, d).transpose(1, 2)
        cos, sin = self.cos[:t], self.sin[:t]
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        if nkv != nh:
            rep = nh // nkv
            k = k[:, :, None].expand(b, nkv, rep, t, d).reshape(b, nh, t, d)
            v = v[:, :, None].expand(b, nkv, rep, t, d).reshape(b, nh, t, d)
        scores = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(d))
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        out = torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2).reshape(b, t, nh * d)
        x = x + F.linear(out, o_w)
        h = self.rms(x, n2)
        return x + F.linear(F.silu(F.linear(h, g_w)) * F.linear(h, u_w), d_w)

    def forward(self, ids):
        x = F.embedding(ids, self.embed)
        for i in range(self.p["layers"]):
            x = self.layer(i, x)
        return F.linear(self.rms(x, self.norm), self.embed)


def bench(name, args):
    torch.manual_seed(0)
    p = PRESETS[name]
    model = Llama(p)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, weight_decay=0.0)
    data = torch.randint(0, p["vocab"], (100000,))

    phases = [0.0, 0.0, 0.0]

    def step():
        starts = torch.randint(0, data.numel() - args.seq - 1, (args.batch, 1))
        idx = starts + torch.arange(args.seq + 1)
        w = data[idx]
        x, y = w[:, :-1], w[:, 1:]
        t0 = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, p["vocab"]), y.reshape(-1))
        t1 = time.perf_counter()
        loss.backward()
        value = loss.item()
        t2 = time.perf_counter()
        torch.stack([q.grad.norm() for q in model.parameters()]).norm().item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        for i, dt in enumerate((t1 - t0, t2 - t1, t3 - t2)):
            phases[i] += dt
        return value

    for _ in range(args.warmup):
        step()
    phases[:] = [0.0, 0.0, 0.0]
    start = time.perf_counter()
    cpu_start = time.process_time()
    for _ in range(args.steps):
        step()
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    tokens = args.batch * args.seq * args.steps
    return {"preset": name, "steps": args.steps, "seconds": seconds,
            "cpu_seconds_per_step": cpu_seconds / args.steps,
            "steps_per_second": args.steps / seconds, "tokens_per_second": tokens / seconds,
            "parameters": sum(q.numel() for q in model.parameters()),
            "forward_seconds": phases[0] / args.steps, "backward_seconds": phases[1] / args.steps,
            "optimizer_seconds": phases[2] / args.steps}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", action="append", required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(json.dumps({"threads": torch.get_num_threads(),
                      "interop_threads": torch.get_num_interop_threads(),
                      "torch": torch.__version__,
                      "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""),
                      "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "")}),
          flush=True)
    for name in args.preset:
        print(json.dumps(bench(name, args)), flush=True)


if __name__ == "__main__":
    main()
