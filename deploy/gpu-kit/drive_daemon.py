"""The GPU run kit's daemon part: the real memprofd, driven by the real memprofctl.

Starts memprofd on --device with the --preset model, then with memprofctl:
  - trains a few steps per run in --runs (NAME = ckpt-off, ckpt-host, nockpt-disk,
    ckpt-off-bf16, ...: gradient checkpointing on/off, offloading off/host/disk,
    and bf16 autocast where the name ends in -bf16), each run's summary with its
    tokens per second;
  - during the --snapshot_run, asks for a snapshot from a second memprofctl while
    the first one is still training (it lands at the next step boundary);
  - around the --record_run, records the memory history and dumps it as a
    memory_viz pickle;
  - scrapes /metrics, checks the counters against the step reports;
  - on CUDA (unless --skip_oom), trains a step that cannot fit: the OOM report
    and what follows it;
  - with --lora, on the --preset model loaded afresh, trains LoRA adapters on the
    device (all-linear, dropout from the device's own generator, checkpointed,
    offloaded to host): the frozen base and the adapters apart in the breakdown,
    then an adapter and a merged snapshot;
  - stops the daemon with SIGTERM (it must exit 0).
Every run trains on one token file of exactly seq_len + 1 ids, so that every batch
is the same window: the snapshot's loss on it (check_snapshot_hf.py) must equal the
loss the daemon reports for the step after the snapshot, and the TRL baseline
(trl_baseline.py) trains on the same batch.

Writes --out (JSON): the runs' step reports and summaries, the snapshot, the
metrics checked, and "checks": [{"name", "ok", "detail"}]. Needs only the Python
standard library and numpy (no grpcio: memprofctl is the client).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np

import kit_daemon
from kit_checks import all_passed, check, checks

p = argparse.ArgumentParser()
p.add_argument("--memprofd", required=True)
p.add_argument("--memprofctl", required=True)
p.add_argument("--device", required=True)  # cuda:0 or cpu
p.add_argument("--preset", required=True)
p.add_argument("--work", required=True)  # snapshots, spill file, token file, logs
p.add_argument("--runs", required=True)  # comma-separated run names
p.add_argument("--snapshot_run", required=True)  # a run name, or none
p.add_argument("--record_run", required=True)  # a run name, or none
p.add_argument("--attn", default="sdpa")  # memprofctl train --attn_implementation
p.add_argument("--skip_oom", action="store_true")
p.add_argument("--lora", action="store_true")
p.add_argument("--steps", type=int, default=5)
p.add_argument("--batch_size", type=int, default=4)
p.add_argument("--seq_len", type=int, default=512)
p.add_argument("--lr", type=float, default=1e-4)
p.add_argument("--out", required=True)
args = p.parse_args()

os.makedirs(args.work, exist_ok=True)


# ---- start the daemon, on free ports, and wait for its model ----
t0 = time.time()  # it creates the preset's model (on the CPU, then moved) before serving
daemon, addr, ports = kit_daemon.start(
    args.memprofd, args.work,
    ["--device=" + args.device, "--model=" + args.preset, "--model_seed=1",
     "--snapshot_root=" + os.path.join(args.work, "snapshots"), "--spill_dir=" + args.work,
     "--data_root=" + os.path.abspath(args.work)])


def ctl(*cmd, timeout=120, check_rc=True):
    """memprofctl --json CMD...; returns the JSON objects it printed."""
    r = subprocess.run([args.memprofctl, "--addr=" + addr, "--json", "--timeout_ms=600000"] + list(cmd),
                       capture_output=True, text=True, timeout=timeout)
    if check_rc and r.returncode != 0:
        raise RuntimeError("memprofctl %s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


# `model` answers FAILED_PRECONDITION while no model is loaded.
while True:
    r = subprocess.run([args.memprofctl, "--addr=" + addr, "--json", "model"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        model = json.loads(r.stdout.splitlines()[0])
        break
    if daemon.poll() is not None or time.time() - t0 > 300:
        sys.exit("memprofd has no model after %.0f s: %s" % (time.time() - t0, r.stderr.strip()))
    time.sleep(0.5)
load_seconds = time.time() - t0
status = ctl("status")[0]
config = model["config"]
num_params = int(model["num_parameters"])
check("daemon serves on " + args.device, status["device"] == args.device or
      (args.device == "cpu" and status["device"].startswith("cpu")),
      "device %s, model %s, %s parameters, ready in %.1f s" % (status["device"], args.preset, num_params, load_seconds))

# ---- one window of seq_len + 1 random ids over the whole vocabulary (uint32) ----
vocab = int(config["vocab_size"])
tokens_path = os.path.join(args.work, "tokens.bin")
ids = np.random.RandomState(0).randint(0, vocab, size=args.seq_len + 1).astype("<u4")
ids.tofile(tokens_path)


def num(v):
    """proto3 JSON writes int64 as strings."""
    return float(v) if isinstance(v, str) else v


def train_run(name):
    ckpt, target, *rest = name.split("-")  # ckpt|nockpt, off|host|disk[, bf16]
    precision = "bf16" if rest == ["bf16"] else "no"
    cmd = [args.memprofctl, "--addr=" + addr, "--json", "train", "--steps", str(args.steps),
           "--batch_size", str(args.batch_size), "--seq_len", str(args.seq_len),
           "--learning_rate", str(args.lr), "--token_data", tokens_path, "--bytes_per_token", "4",
           "--attn_implementation", args.attn, "--mixed_precision", precision]
    if ckpt == "ckpt":
        cmd.append("--gradient_checkpointing")
    if target != "off":
        cmd += ["--offload", "--offload_target", target]
    if name == args.record_run:
        ctl("memory", "record", "start", "--max_entries", "200000")
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reports, snap_proc = [], None
    for line in proc.stdout:
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        reports.append(r)
        print("  %s step %s loss %.4f %.3f s peak %.0f MiB resident %.0f MiB out %.0f MiB" % (
            name, r["step"], r["loss"], r["step_seconds"], num(r["peak_allocated_bytes"]) / 2**20,
            num(r["offload"]["peak_resident_saved_bytes"]) / 2**20, num(r["offload"]["bytes_out"]) / 2**20),
            flush=True)
        # A snapshot requested while this training runs: at the next step boundary.
        if name == args.snapshot_run and snap_proc is None and int(r["step"]) >= 2:
            snap_proc = subprocess.Popen(
                [args.memprofctl, "--addr=" + addr, "--json", "--timeout_ms=600000", "snapshot", "mid-training"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rc = proc.wait()
    err = proc.stderr.read().strip()
    result = {"name": name, "reports": reports, "seconds": time.time() - start}
    check("train %s: %d steps" % (name, args.steps), rc == 0 and len(reports) == args.steps,
          "exit %d %s" % (rc, err))
    if snap_proc is not None:
        out, serr = snap_proc.communicate(timeout=600)
        manifests = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        if check("snapshot during %s" % name, snap_proc.returncode == 0 and manifests,
                 "exit %d %s" % (snap_proc.returncode, serr.strip())):
            result["snapshot"] = manifests[0]
    if name == args.record_run:
        dump = os.path.join(args.work, "memory-history.pickle")
        ctl("memory", "dump", "-o", dump, timeout=300)
        ctl("memory", "record", "stop")
        result["memory_dump"] = dump
        check("memory history dump", os.path.getsize(dump) > 0, "%d bytes" % os.path.getsize(dump))
    # Summary: the median step time leaves out step 1 (warm-up) when there are more.
    timed = reports[1:] if len(reports) > 2 else reports
    if reports:
        step_seconds = statistics.median(r["step_seconds"] for r in timed)
        result["summary"] = {
            "step_seconds": step_seconds, "precision": precision,
            "tokens_per_second": args.batch_size * args.seq_len / step_seconds,
            "peak_allocated_bytes": max(num(r["peak_allocated_bytes"]) for r in reports),
            "peak_resident_saved_bytes": max(num(r["offload"]["peak_resident_saved_bytes"]) for r in reports),
            "bytes_out": statistics.median(num(r["offload"]["bytes_out"]) for r in timed),
            "trl_baseline_bytes_out": statistics.median(num(r["offload"]["trl_baseline_bytes_out"]) for r in timed),
            "first_loss": reports[0]["loss"], "last_loss": reports[-1]["loss"],
        }
    return result


def lora_run():
    """LoRA on the device: 3 steps of r 8 adapters on every projection with
    dropout 0.1 (masks from a generator of the device), gradient checkpointing
    and offloading to host; the frozen base and the adapters apart in the
    breakdown; an adapter and a merged snapshot of the result."""
    ctl("load", "--preset", args.preset, timeout=600)  # a model that has not trained
    reports = ctl("train", "--steps", "3", "--batch_size", str(args.batch_size),
                  "--seq_len", str(args.seq_len), "--learning_rate", str(args.lr),
                  "--token_data", tokens_path, "--bytes_per_token", "4",
                  "--lora_r", "8", "--lora_targets", "all-linear", "--lora_dropout", "0.1",
                  "--gradient_checkpointing", "--offload", "--offload_target", "host",
                  timeout=900)
    steps = [r for r in reports if "loss" in r and "step" in r]
    check("LoRA: 3 steps with dropout, checkpointed and offloaded",
          len(steps) == 3 and all(np.isfinite(r["loss"]) for r in steps),
          [(r["step"], r["loss"]) for r in steps])
    top = check_categories_sum("LoRA: categories sum to the allocator's bytes")
    by = {c["category"]: num(c["bytes"]) for c in top["categories"]}
    check("LoRA: the frozen base and the adapters apart",
          by.get("frozen_parameters", 0) > by.get("parameters", 0) > 0,
          "frozen_parameters %s, parameters %s" % (by.get("frozen_parameters"),
                                                   by.get("parameters")))
    for kind in ("adapter", "merged"):
        made = ctl("snapshot", "lora-" + kind, "--kind", kind, timeout=600)
        check("LoRA: %s snapshot" % kind, bool(made) and made[0].get("kind", "").lower()
              .endswith(kind), made[0] if made else None)
    # The frozen base loaded in bf16 (never held in float32), trained under
    # bf16 autocast: half the base's bytes.
    ctl("load", "--preset", args.preset, "--base_dtype", "bf16", timeout=600)
    bf16 = ctl("train", "--steps", "2", "--batch_size", str(args.batch_size),
               "--seq_len", str(args.seq_len), "--learning_rate", str(args.lr),
               "--token_data", tokens_path, "--bytes_per_token", "4",
               "--lora_r", "8", "--lora_targets", "all-linear",
               "--mixed_precision", "bf16", "--base_dtype", "bf16",
               "--gradient_checkpointing", timeout=900)
    bf16_steps = [r for r in bf16 if "loss" in r and "step" in r]
    check("LoRA: 2 steps on a bf16 base", len(bf16_steps) == 2 and
          all(np.isfinite(r["loss"]) for r in bf16_steps),
          [(r["step"], r["loss"]) for r in bf16_steps])
    top = check_categories_sum("LoRA, bf16 base: categories sum to the allocator's bytes")
    half = num({c["category"]: c["bytes"] for c in top["categories"]}
               .get("frozen_parameters", 0))
    check("LoRA: a bf16 base holds half the float32 base's bytes",
          abs(2 * half - by.get("frozen_parameters", 0)) <= 0.01 * by.get(
              "frozen_parameters", 1),
          "bf16 %s, float32 %s" % (half, by.get("frozen_parameters")))
    return {"reports": steps, "categories": by, "bf16_base_reports": bf16_steps,
            "bf16_frozen_parameters": half}


def check_categories_sum(name):
    """Where every byte goes: the allocator's blocks (on CUDA, the caching
    allocator's, attributed from before the model loaded) add up, by category,
    to its bytes (on CUDA, the requested ones). Returns the breakdown."""
    top = ctl("memory", "top", "--by", "category")[0]
    attributed, allocator = num(top["attributed_bytes"]), num(top["allocator_bytes"])
    check(name, allocator > 0 and abs(attributed - allocator) <= 0.001 * allocator,
          "%d attributed of %d" % (attributed, allocator))
    return top


def train_one_step(tokens_path, batch):
    """memprofctl train, one step of batch x --seq_len on the token file."""
    return subprocess.run([args.memprofctl, "--addr=" + addr, "--json", "--timeout_ms=600000",
                           "train", "--steps", "1", "--batch_size", str(batch),
                           "--seq_len", str(args.seq_len), "--token_data", tokens_path,
                           "--bytes_per_token", "4"],
                          capture_output=True, text=True, timeout=600)


def cuda_oom(tokens_path, vocab):
    """A step that cannot fit on the device: a batch whose logits alone would
    be four times a 150 GB device. The caching allocator throws
    OutOfMemoryError; its OOM observer captures the request and the live
    blocks (with their attribution) before the unwinding frees them. The
    operation fails RESOURCE_EXHAUSTED, the report says what filled the
    device, the categories still add up afterwards, and a small step trains."""
    batch = max(1, int(4 * 150e9 / (args.seq_len * vocab * 2)))
    r = train_one_step(tokens_path, batch)
    check("cuda oom: a %d x %d step fails out of memory" % (batch, args.seq_len),
          r.returncode == 4 and "out of memory" in r.stderr, "exit %d %s" % (r.returncode, r.stderr.strip()[-300:]))
    rep = ctl("memory", "oom")[0]
    largest = rep.get("largest_allocations", [])
    cats = {c["category"]: num(c.get("bytes", 0)) for c in rep.get("categories", [])}
    check("cuda oom: the report captured the failed request on " + status["device"],
          rep.get("captured") and rep.get("device") == status["device"] and
          num(rep.get("requested_bytes", 0)) > num(rep.get("free_bytes", 0)) and
          num(rep.get("failed_at_unix_ms", 0)) > 0 and
          0 <= num(rep.get("written_at_unix_ms", 0)) - num(rep["failed_at_unix_ms"]) < 1000,
          "request %s B in %s, module %s, op %s, free %s of %s B" % (
              rep.get("requested_bytes"), rep.get("phase"), rep.get("module"), rep.get("op"),
              rep.get("free_bytes"), rep.get("total_bytes")))
    check("cuda oom: the 20 largest live blocks, each with a category",
          len(largest) == 20 and all(a.get("category") for a in largest),
          ", ".join("%s %s %s" % (a.get("bytes"), a.get("category"), a.get("module", ""))
                    for a in largest[:3]))
    check("cuda oom: the parameters among the live bytes", cats.get("parameters", 0) > 0, cats)
    check_categories_sum("cuda oom: categories still sum to the allocator's bytes")
    r = train_one_step(tokens_path, 1)
    check("cuda oom: a small step trains after it", r.returncode == 0, r.stderr.strip()[-300:])


runs, snapshot, memory, lora = {}, None, None, None
try:
    for name in args.runs.split(","):
        runs[name] = train_run(name)

    # ---- the snapshot and the step after it ----
    for r in runs.values():
        snapshot = r.get("snapshot", snapshot)
    all_reports = [rep for r in runs.values() for rep in r["reports"]]
    if snapshot is not None:
        step = int(snapshot["global_step"])
        after = [rep for rep in all_reports if int(rep["global_step"]) == step + 1]
        snapshot = {"directory": snapshot["directory"], "global_step": step,
                    "total_size": int(snapshot["total_size"]),
                    "duration_seconds": snapshot["duration_seconds"],
                    "peak_extra_device_bytes": int(snapshot["peak_extra_device_bytes"]),
                    "peak_extra_host_bytes": int(snapshot["peak_extra_host_bytes"]),
                    "next_step_loss": after[0]["loss"] if after else None}
        check("a training step after the snapshot", after, "snapshot at global step %d" % step)
    finite = all(np.isfinite(rep["loss"]) for rep in all_reports)
    check("every loss finite", finite and all_reports, "%d step reports" % len(all_reports))

    # ---- /metrics against what the step reports say ----
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % ports["metrics_port"], timeout=30) as resp:
        text = resp.read().decode()
    open(os.path.join(args.work, "metrics.txt"), "w").write(text)
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)

    def metric(prefix):
        return [v for k, v in samples.items() if k == prefix or k.startswith(prefix + "{")]

    def labelled(prefix, label):
        return [v for k, v in samples.items() if k.startswith(prefix + "{") and label in k]

    steps_total = metric("memprofd_train_steps_total")
    check("metrics: train steps", steps_total == [len(all_reports)], "%s vs %d" % (steps_total, len(all_reports)))
    moved = sum(num(rep["offload"]["bytes_out"]) for rep in all_reports)
    out_total = labelled("memprofd_offload_moved_bytes_total", 'direction="out"')
    check("metrics: offloaded bytes out", out_total and abs(out_total[0] - moved) <= 0.001 * max(moved, 1),
          "%s vs %d" % (out_total, moved))
    dev_label = 'device="%s"' % status["device"]
    peak = labelled("memprofd_memory_peak_allocated_bytes", dev_label)
    check("metrics: peak allocated on " + status["device"], peak and peak[0] > 0, peak)
    check("metrics: build info", labelled("memprofd_build_info", dev_label), "")
    check("metrics: snapshots", sum(metric("memprofd_snapshots_total")) >= (1 if snapshot else 0), "")
    if args.device.startswith("cuda"):
        reserved = metric("memprofd_cuda_reserved_bytes")
        check("metrics: CUDA reserved bytes", reserved and reserved[0] > 0, reserved)
    # The categories add up, and the weights are the parameters'.
    top = check_categories_sum("breakdown: categories sum to the allocator's bytes on " +
                               status["device"])
    params = [num(c["bytes"]) for c in top["categories"] if c["category"] == "parameters"]
    check("breakdown: parameters attributed on " + top["device"],
          bool(params) and params[0] > 0, params)
    memory = ctl("memory")[0]
    # ---- the snapshot's weights evaluated in float32 and under bf16 autocast ----
    # (check_snapshot_hf.py compares both with transformers on the same window.)
    if snapshot is not None:
        ctl("load", "--hf_dir", snapshot["directory"], timeout=600)
        for precision in ("no", "bf16"):
            ev = ctl("evaluate", "--token_data", tokens_path, "--bytes_per_token", "4",
                     "--batch_size", "1", "--seq_len", str(args.seq_len),
                     "--mixed_precision", precision, timeout=600)
            loss = ev[0]["evaluate"]["loss"] if ev and "evaluate" in ev[0] else None
            snapshot["eval_loss_" + precision] = loss
            check("evaluate the snapshot (mixed_precision %s)" % precision,
                  loss is not None and np.isfinite(loss), loss)
    if args.device.startswith("cuda") and not args.skip_oom:
        cuda_oom(tokens_path, vocab)
    # Last: the adapters freeze the model's base for good.
    if args.lora:
        lora = lora_run()
except Exception as e:  # a failed command: recorded, and the daemon still stopped
    check("daemon part ran through", False, repr(e))
finally:
    # ---- SIGTERM: drain, exit 0 ----
    rc = kit_daemon.stop(daemon)
check("memprofd exits 0 on SIGTERM", rc == 0, "exit %s" % rc)

record = [r for r in runs.values() if "memory_dump" in r]
json.dump({"device": status["device"], "build": status.get("build"), "preset": args.preset,
           "config": config, "num_parameters": num_params, "load_seconds": load_seconds,
           "batch_size": args.batch_size, "seq_len": args.seq_len, "steps": args.steps, "lr": args.lr,
           "attn": args.attn,
           "tokens": tokens_path, "runs": runs, "snapshot": snapshot,
           "memory_dump": record[0]["memory_dump"] if record else None,
           "memory": memory, "lora": lora, "checks": checks},
          open(args.out, "w"), indent=1)
sys.exit(0 if all_passed() else 1)
