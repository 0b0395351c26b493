#!/usr/bin/env python3
"""PyTorch reference for bench/train_bench.cc: transformers' LlamaForCausalLM.

Builds the model from the config.json that train_bench writes for a memprofd
preset (LlamaConfig::ToJson), float32, once per variant asked for ("sdpa",
"eager", or "sdpa:bf16": the forward under torch.autocast(dtype=bfloat16),
weights and optimizer state float32), and trains it with memprofd's step: next-token
cross-entropy, backward, global gradient norm, torch.optim.AdamW(fused=True)
(foreach when fused is not available, which the JSON says) with memprofd's
parameter groups (weight decay on tensors of 2 or more dimensions, none on
the RMSNorm weights). Prints a JSON header line (threads, versions), then one
JSON object per implementation.

Saved-activation bytes: one extra, untimed step under a saved_tensors_hooks
that keeps, per distinct storage that is not a parameter's, its size in
bytes; their sum at the end of the forward (when everything backward needs
is saved) is the figure, comparable to memprofd's offloader accounting
(peak resident saved bytes, storages counted once).

With --lora R (> 0), peft.get_peft_model wraps the model in LoRA adapters of
rank R, lora_alpha 2R, on every projection (lora_dropout 0), which alone
train: the optimizer, the gradient norm and the saved-bytes count take the
trainable parameters (the frozen base stays a parameter, never counted as
saved).

Usage: train_bench_torch.py --config DIR --attn sdpa --attn eager --attn sdpa:bf16 --batch 8
       --seq 128 --warmup 2 --steps 10 [--threads N] [--lora R]
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
import transformers
from transformers import AutoConfig, LlamaForCausalLM


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def make_optimizer(model):
    decay = [p for p in trainable(model) if p.dim() >= 2]
    no_decay = [p for p in trainable(model) if p.dim() < 2]
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.0, fused=True), "fused"
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.0, foreach=True), "foreach"


def forward_loss(model, x, y, vocab, bf16):
    """memprofd's loss: the forward under autocast when bf16, the
    cross-entropy in float32 on logits upcast (a no-op in float32)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))


def saved_bytes(model, x, y, vocab, bf16):
    """Bytes of distinct non-parameter storages saved for backward by one step."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward_loss(model, x, y, vocab, bf16)
    total = sum(storages.values())
    loss.backward()
    model.zero_grad(set_to_none=True)
    return total


def bench(config_dir, variant, args):
    attn, _, precision = variant.partition(":")
    bf16 = precision == "bf16"
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(config_dir, attn_implementation=attn)
    model = LlamaForCausalLM(config).to(torch.float32)
    assert model.config._attn_implementation == attn, model.config._attn_implementation
    if args.lora > 0:
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0, task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                            "down_proj"]))
    model.train()
    vocab = config.vocab_size
    opt, opt_kind = make_optimizer(model)
    data = torch.randint(0, vocab, (100000,))
    phases = [0.0, 0.0, 0.0]

    def batch():
        starts = torch.randint(0, data.numel() - args.seq - 1, (args.batch, 1))
        w = data[starts + torch.arange(args.seq + 1)]
        return w[:, :-1], w[:, 1:]

    def step():
        x, y = batch()
        t0 = time.perf_counter()
        loss = forward_loss(model, x, y, vocab, bf16)
        t1 = time.perf_counter()
        loss.backward()
        loss.item()
        t2 = time.perf_counter()
        torch.stack([p.grad.norm() for p in trainable(model)]).norm().item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        for i, dt in enumerate((t1 - t0, t2 - t1, t3 - t2)):
            phases[i] += dt

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
    x, y = batch()
    return {"attn": attn, "precision": precision or "no", "optimizer": opt_kind, "steps": args.steps, "seconds": seconds,
            "cpu_seconds_per_step": cpu_seconds / args.steps,
            "steps_per_second": args.steps / seconds, "tokens_per_second": tokens / seconds,
            "parameters": sum(p.numel() for p in model.parameters()),
            "trainable_parameters": sum(p.numel() for p in trainable(model)),
            "forward_seconds": phases[0] / args.steps,
            "backward_seconds": phases[1] / args.steps,
            "optimizer_seconds": phases[2] / args.steps,
            "saved_bytes": saved_bytes(model, x, y, vocab, bf16)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True, help="folder holding config.json")
    parser.add_argument("--attn", action="append", required=True,
                        choices=["sdpa", "eager", "sdpa:bf16", "eager:bf16"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--lora", type=int, default=0)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(json.dumps({"threads": torch.get_num_threads(),
                      "interop_threads": torch.get_num_interop_threads(),
                      "torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": __import__("peft").__version__ if args.lora > 0 else "",
                      "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""),
                      "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "")}),
          flush=True)
    for variant in args.attn:
        print(json.dumps(bench(args.config, variant, args)), flush=True)


if __name__ == "__main__":
    main()
