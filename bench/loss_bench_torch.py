#!/usr/bin/env python3
"""transformers' side of bench/loss_bench.cc: LlamaForCausalLM's own (eager) loss.

Builds LlamaForCausalLM from the config.json loss_bench writes (float32), and
trains it as transformers does: model(input_ids=x, labels=x).loss, whose
ForCausalLMLoss upcasts the [batch, seq, vocab] logits to float32 and calls
cross_entropy on all of them; backward; torch.optim.AdamW(fused=True).

Peak: torch.cuda's memory statistics do not exist on the CPU, so the figure
comes from PyTorch's CPU allocator as its profiler reports it:
torch.profiler.profile(profile_memory=True) around one step, and the largest
"Total Allocated" of its [memory] events (the CPU allocator's running total of
the bytes allocated since profiling started, net of frees). That is the step's
peak above the bytes already held when the step began (weights and AdamW
state, after a warm-up step), the same quantity as loss_bench's
"peak above the start of the step" from memprofd's recorder.

Prints one JSON object: step seconds (best of --steps timed steps after one
warm-up, without the profiler), peak bytes above the step's start, the loss.

Usage: loss_bench_torch.py --config DIR --batch 4 --seq 1024 --steps 2 [--threads N]
"""

import argparse
import json
import os
import tempfile
import time

import torch
import transformers
from transformers import AutoConfig, LlamaForCausalLM


def step(model, optimizer, x):
    optimizer.zero_grad(set_to_none=True)
    loss = model(input_ids=x, labels=x, use_cache=False).loss
    loss.backward()
    optimizer.step()
    return loss.item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    config = AutoConfig.from_pretrained(a.config)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, config.vocab_size, (a.batch, a.seq), generator=g)
    step(model, optimizer, x)  # warm-up: AdamW's state exists from here
    times = []
    loss = 0.0
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step(model, optimizer, x)
        times.append(time.perf_counter() - t0)
    optimizer.zero_grad(set_to_none=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        step(model, optimizer, x)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    peak = 0
    for e in trace.get("traceEvents", []):
        if e.get("name") == "[memory]":
            args = e.get("args", {})
            if args.get("Device Type") in (0, None):  # CPU
                peak = max(peak, int(args.get("Total Allocated", 0)))
    print(json.dumps({
        "step_seconds": min(times),
        "peak_above_start_bytes": peak,
        "loss": loss,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }))


if __name__ == "__main__":
    main()
