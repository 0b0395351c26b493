"""The GPU run kit's baseline: the daemon's model and batch in transformers, with
and without TRL's activation offloading (trl.models.activation_offloading, the
reference the daemon's offloader is measured against), and with Liger's fused
linear cross-entropy (liger_kernel, the reference the daemon's fused loss is
measured against).

  trl_baseline.py DAEMON_RESULTS.json DEVICE TRL_DIR OUT.json [MODES [LIGER_DIR]]

TRL_DIR holds TRL's wheel, unpacked (the GPU host has no TRL). TRL's other
dependencies (datasets, pandas, pyarrow, ...) are hidden from the import system
first, so this also shows that the offloading module works without them.

The model: LlamaForCausalLM loaded from the daemon's mid-training snapshot (the
same config and weights; float32, the attention the daemon ran), or built
from its config if there is none. The batch: the daemon's one window, batch_size
times. Each step: forward, cross-entropy, backward, AdamW (the daemon's
hyperparameters), gradients dropped, as the daemon's step does.

MODES (default ckpt-none,nockpt-none,ckpt-trl,nockpt-trl): gradient checkpointing
(transformers', non-reentrant) on or off x offloading none or TRL's
get_act_offloading_ctx_manager(model) (its SFTTrainer's: pinned memory, a side
stream, the LM head not offloaded), or "liger": no offloading, the head and the
loss by Liger's LigerFusedLinearCrossEntropyLoss on the final hidden states
(its wheel unpacked in LIGER_DIR; a liger mode is skipped, saying so, where
liger_kernel does not import or there is no CUDA device, its kernels being
Triton's); a mode ending in -bf16 runs forward and loss under
torch.autocast(dtype=torch.bfloat16), float32 weights and AdamW, as the
daemon's mixed_precision bf16. Attention: the daemon's (DAEMON_RESULTS'
"attn", eager when absent). Per mode: one warm-up step, steps 2..N timed
(median step time, peak allocated bytes), then one more step instrumented to
measure the resident saved-activation bytes as the daemon counts them (storages
of saved non-parameter tensors kept on the compute device, sources of copies in
flight, reloaded copies) and the bytes moved off the device.
"""
import contextlib
import importlib.machinery
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd.graph import saved_tensors_hooks

results_path, device, trl_dir, out_path = sys.argv[1:5]
modes = (sys.argv[5] if len(sys.argv) > 5 else "ckpt-none,nockpt-none,ckpt-trl,nockpt-trl").split(",")
liger_dir = sys.argv[6] if len(sys.argv) > 6 else None
modes.sort(key=lambda m: m.split("-")[1] == "trl")  # TRL's head hooks stay on the model: plain runs first
res = json.load(open(results_path))
cuda = device.startswith("cuda")
checks = []


def check(name, ok, detail=""):
    checks.append({"name": name, "ok": bool(ok), "detail": str(detail)})
    print("%-5s %s %s" % ("ok" if ok else "FAIL", name, detail), flush=True)


# ---- TRL from the unpacked wheel, with its unneeded dependencies hidden ----
HIDDEN = {"datasets", "pandas", "pyarrow", "dill", "multiprocess", "xxhash"}


class Hide:
    """The path finder, blind to HIDDEN (as if they were not installed)."""

    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        return None if name.split(".")[0] in HIDDEN else self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


sys.meta_path[:] = [Hide(f) if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
sys.path.insert(0, trl_dir)
before = set(sys.modules)  # (torch may have imported dill already, if it is installed)
from trl.models import activation_offloading as trl_ao  # noqa: E402

loaded_hidden = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in HIDDEN)
check("TRL's activation_offloading from the carried wheel, its other deps absent",
      trl_ao.__file__.startswith(os.path.abspath(trl_dir)) and not loaded_hidden,
      "%s (hidden: %s)" % (trl_ao.__file__, ", ".join(sorted(HIDDEN))))

from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False  # LibTorch's default too: fp32 matmuls
attn = res.get("attn", "eager")
snap = res.get("snapshot")
if snap:
    model = AutoModelForCausalLM.from_pretrained(snap["directory"], dtype=torch.float32,
                                                 attn_implementation=attn, device_map=device)
else:
    # The daemon's config (memprofctl model: int64 fields as strings) as
    # transformers' LlamaConfig: the shape, and the rope scaling where it has one.
    c = {k: int(v) if isinstance(v, str) and v.lstrip("-").isdigit() else v
         for k, v in res["config"].items()}
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
              "rms_norm_eps", "rope_theta", "tie_word_embeddings", "head_dim")
    kwargs = {k: c[k] for k in fields if k in c}
    rope = c.get("rope") or {}
    if rope.get("rope_type", "default") != "default":
        kwargs["rope_scaling"] = {k: int(v) if isinstance(v, str) and v.isdigit() else v
                                  for k, v in rope.items()}
    cfg = LlamaConfig(**kwargs)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(cfg, dtype=torch.float32, attn_implementation=attn)
model.train()
model.config.use_cache = False
opt = torch.optim.AdamW(model.parameters(), lr=res["lr"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
ids = torch.from_numpy(np.fromfile(res["tokens"], dtype="<u4").astype(np.int64)).to(device)
window = ids.unsqueeze(0).expand(res["batch_size"], -1)
inputs, targets = window[:, :-1].contiguous(), window[:, 1:].contiguous()
param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
compute = torch.device(device).type


class Meter:
    """Resident saved-activation bytes, sampled at every pack and unpack."""

    def __init__(self, trl_ctx=None):
        self.trl, self.kept, self.peak, self.moved = trl_ctx, {}, 0, 0

    def sample(self):
        tensors = list(self.kept.values())
        if self.trl is not None:
            tensors += [t for t, offloaded, *_ in self.trl.tracker.values() if not offloaded]
            tensors += [t for t, _ in getattr(self.trl, "fwd_stash", {}).values()]
            tensors += list(getattr(self.trl, "bwd_tensor_stash", {}).values())
        live = {}
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type == compute:
                s = t.untyped_storage()
                if s.data_ptr() not in param_storages:
                    live[s.data_ptr()] = s.nbytes()
        self.peak = max(self.peak, sum(live.values()))


class KeepAndCount(saved_tensors_hooks):
    """Saves tensors as they are (no offloading) and lets the meter see them."""

    def __init__(self, meter):
        def pack(t):
            meter.kept[id(t)] = t
            meter.sample()
            return t

        def unpack(t):
            meter.kept.pop(id(t), None)
            meter.sample()
            return t

        super().__init__(pack, unpack)


def instrument_trl(ctx, meter):
    """Wraps TRL's hooks so that the meter samples after each of them."""
    pack0, unpack0 = ctx.pack_hook, ctx.unpack_hook

    def pack(t):
        tid = pack0(t)
        entry = ctx.tracker.get(tid)
        if entry is not None and entry[1]:  # offloaded: a host copy was made
            meter.moved += entry[0].untyped_storage().nbytes()
        meter.sample()
        return tid

    def unpack(tid):
        t = unpack0(tid)
        meter.sample()
        return t

    def restore():
        ctx.pack_hook, ctx.unpack_hook = pack0, unpack0

    ctx.pack_hook, ctx.unpack_hook = pack, unpack
    return restore


def make_trl_ctx():
    """TRL's SFTTrainer's context manager for this model."""
    if cuda:
        return trl_ao.get_act_offloading_ctx_manager(model)
    # On a CPU host TRL's accelerator type would be "cuda" (a CUDA build) and it
    # would keep every tensor; as "cpu" it copies them CPU to CPU, which runs its
    # pack and unpack paths (no pinned memory, no streams without a device).
    real = torch.accelerator.current_accelerator
    torch.accelerator.current_accelerator = lambda *a, **k: torch.device("cpu")
    try:
        return trl_ao.get_act_offloading_ctx_manager(model, use_pin_memory=False, use_streams=False)
    finally:
        torch.accelerator.current_accelerator = real


def import_liger():
    """Liger's fused linear cross-entropy loss, or the reason it cannot run here."""
    if not cuda:
        return None, "skipped: no CUDA device (Liger's kernels are Triton's, GPU only)"
    if liger_dir:
        sys.path.insert(0, liger_dir)
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except Exception as e:  # noqa: BLE001 (any import failure: skipped, saying why)
        return None, "skipped: liger_kernel does not import (%s)" % repr(e)[:200]
    return LigerFusedLinearCrossEntropyLoss(), None


liger_loss, liger_skipped = None, None


def step(ctx, precision="no", loss_kind="hf"):
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    autocast = (torch.autocast(compute, dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    with ctx, autocast:
        if loss_kind == "liger":
            hidden = model.model(input_ids=inputs).last_hidden_state
            loss = liger_loss(model.lm_head.weight, hidden.reshape(-1, hidden.shape[-1]),
                              targets.reshape(-1))
            logits = None
        else:
            logits = model(input_ids=inputs).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
    del logits
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    value = loss.item()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, (torch.cuda.max_memory_allocated() if cuda else None), value


trl_ctx = None
out = {}
for mode in modes:
    ckpt, offload, *rest = mode.split("-")
    precision = "bf16" if rest == ["bf16"] else "no"
    loss_kind = "liger" if offload == "liger" else "hf"
    if loss_kind == "liger":
        if liger_loss is None and liger_skipped is None:
            liger_loss, liger_skipped = import_liger()
        if liger_loss is None:
            out[mode] = {"skipped": liger_skipped}
            print("%-16s %s" % (mode, liger_skipped), flush=True)
            continue
    if ckpt == "ckpt":
        model.gradient_checkpointing_enable()  # use_reentrant=False, transformers' default
    else:
        model.gradient_checkpointing_disable()
    if offload == "trl" and trl_ctx is None:
        trl_ctx = make_trl_ctx()
    ctx = trl_ctx if offload == "trl" else contextlib.nullcontext()
    times, peaks, losses = [], [], []
    for i in range(res["steps"]):
        dt, peak, loss = step(ctx, precision, loss_kind)
        losses.append(loss)
        if i > 0 or res["steps"] < 3:
            times.append(dt)
            peaks.append(peak)
    # One more step, measured: TRL's hooks wrapped, or plain saving made visible;
    # the LM head's saved tensors (kept on the device by TRL) counted either way.
    meter = Meter(trl_ctx if offload == "trl" else None)
    if offload == "trl":
        restore = instrument_trl(trl_ctx, meter)
        head = KeepAndCount(meter)
        handles = [model.lm_head.register_forward_pre_hook(lambda *a: head.__enter__()),
                   model.lm_head.register_forward_hook(lambda *a: head.__exit__(), prepend=True)]
        step(trl_ctx)
        restore()
        for h in handles:
            h.remove()
    else:
        step(KeepAndCount(meter), precision, loss_kind)
    out[mode] = {"step_seconds": statistics.median(times), "precision": precision,
                 "tokens_per_second": inputs.numel() / statistics.median(times),
                 "peak_allocated_bytes": max(peaks) if cuda else None,
                 "peak_resident_saved_bytes": meter.peak, "bytes_out": meter.moved,
                 "first_loss": losses[0], "last_loss": losses[-1]}
    print("%-16s %.3f s/step  peak %s  resident %.0f MiB  moved %.0f MiB  loss %.4f -> %.4f" % (
        mode, out[mode]["step_seconds"],
        "%.0f MiB" % (out[mode]["peak_allocated_bytes"] / 2**20) if cuda else "n/a",
        meter.peak / 2**20, meter.moved / 2**20, losses[0], losses[-1]), flush=True)
    check("%s: losses finite" % mode, all(np.isfinite(losses)), losses)

json.dump({"modes": out, "trl_file": trl_ao.__file__, "checks": checks,
           "device_name": torch.cuda.get_device_name() if cuda else "cpu",
           "transformers_first_loss": out[modes[0]].get("first_loss")}, open(out_path, "w"), indent=1)
sys.exit(0 if all(c["ok"] for c in checks) else 1)
