#!/usr/bin/env python3
"""peft's view of memprofd's LoRA (tests/snapshot/lora_peft_test.cc).

Usage: lora_reference.py ROOT

ROOT holds base/ (a weights snapshot: config.json, model.safetensors),
adapter/ (an adapter snapshot: adapter_config.json,
adapter_model.safetensors), grads/ (the gradients memprofd computed, under
the adapters' names) and ids.json ([B][T] token ids). transformers loads the
base, peft.PeftModel.from_pretrained the adapter onto it (trainable); the
mean next-token loss on ids is computed and back-propagated as transformers
computes it. Prints one JSON line: the loss, how many parameters peft trains,
the adapters whose names did not match memprofd's, and the largest gradient
and gradient difference.
"""

import json
import os
import sys

import peft
import safetensors.torch
import torch
import transformers


def main():
    root = sys.argv[1]
    base = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(root, "base"), dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, os.path.join(root, "adapter"),
                                           is_trainable=True)
    with open(os.path.join(root, "ids.json")) as f:
        ids = torch.tensor(json.load(f), dtype=torch.long)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    expected = safetensors.torch.load_file(
        os.path.join(root, "grads", "adapter_model.safetensors"))
    trainable = {name.replace(".default", ""): p
                 for name, p in model.named_parameters() if p.requires_grad}
    unmatched = sorted(set(trainable) ^ set(expected))
    diff = 0.0
    largest = 0.0
    for name, grad in expected.items():
        if name not in trainable or trainable[name].grad is None:
            continue
        diff = max(diff, (trainable[name].grad - grad).abs().max().item())
        largest = max(largest, grad.abs().max().item())
    print(json.dumps({"loss": out.loss.item(), "trainable": len(trainable),
                      "unmatched": unmatched, "max_grad": largest,
                      "max_grad_diff": diff}))


if __name__ == "__main__":
    main()
