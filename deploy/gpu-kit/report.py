"""The GPU run kit's one table: every check, then the figures side by side.

  report.py WORK OUT.json

Reads what the parts left in WORK: parts.tsv (part, exit status, seconds, note,
written by gpu-run.sh), the gtest XML files, daemon.json, hf.json, viz.json,
trl.json, speed.json, speed_hf.json, limit.json and nccl.json. Prints the table, writes everything to
OUT.json, exits 1 if any part or check failed (a part that did not run is a failure too).

The speed table (the speed parts): memprofd, transformers and transformers +
Liger's fused linear cross-entropy on the same model, batch and checkpointing,
float32 and bf16: step time, tokens per second, peak allocated and MFU, the
model FLOPs per token (PaLM's 6 N + 12 L hidden seq, N the layers' projections
and the head) over the device's dense bf16 peak from its datasheet
(DENSE_BF16_PEAK; n/a for a device not listed and on the CPU), and the
targets: memprofd's step <= 0.97x transformers' in each precision, MFU >= 45%
in bf16, peak <= transformers + Liger's. Targets are printed, not checks: a
run that misses one still passes.
"""
import glob
import json
import os
import signal
import sys
import xml.etree.ElementTree as ET

work, out_path = sys.argv[1:3]


def load(name):
    path = os.path.join(work, name)
    return json.load(open(path)) if os.path.exists(path) else None


def size(b):
    if b is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(b) < 1024 or unit == "GiB":
            return "%.0f %s" % (b, unit) if unit == "B" else "%.2f %s" % (b, unit)
        b /= 1024.0


rows = []  # (check, ok, detail)
parts = {}
if os.path.exists(os.path.join(work, "parts.tsv")):
    for line in open(os.path.join(work, "parts.tsv")):
        name, rc, secs, note = (line.rstrip("\n").split("\t") + ["", "", ""])[:4]
        parts[name] = (int(rc), float(secs), note)
skipped_names, failed_names = [], []
for name, (rc, secs, note) in parts.items():
    detail = "%.0f s%s" % (secs, ("; " + note) if note else "")
    if rc > 128 and rc - 128 in signal.Signals._value2member_map_:
        detail = "killed by %s, %s" % (signal.Signals(rc - 128).name, detail)
    elif rc not in (0, 125):
        detail = "exit %d, %s" % (rc, detail)
    xml = os.path.join(work, name + ".xml")
    if os.path.exists(xml):
        root = ET.parse(xml).getroot()
        cases = root.findall(".//testcase")
        skipped = [c for c in cases if c.get("result") == "skipped" or c.find("skipped") is not None]
        failed = [c for c in cases if c.find("failure") is not None]
        skipped_names += ["%s.%s" % (c.get("classname"), c.get("name")) for c in skipped]
        failed_names += ["%s.%s" % (c.get("classname"), c.get("name")) for c in failed]
        detail = "%d tests, %d failed, %d skipped, %s" % (len(cases), len(failed), len(skipped), detail)
    rows.append((name, rc == 0, detail))

mode = open(os.path.join(work, "mode")).read().strip() if os.path.exists(os.path.join(work, "mode")) else "?"
if mode == "gpu" and any(name.endswith("_test") for name in parts):
    cuda_skipped = [n for n in skipped_names if "cuda" in n.lower()]
    rows.append(("CUDA test cases ran (none skipped)", not cuda_skipped,
                 "skipped: " + ", ".join(cuda_skipped) if cuda_skipped else ""))

docs = {k: load(k + ".json") for k in ("daemon", "hf", "viz", "trl", "speed", "speed_hf", "limit", "nccl")}
for key, doc in docs.items():
    for c in (doc or {}).get("checks", []):
        rows.append(("%s: %s" % (key, c["name"]), c["ok"], c["detail"]))

d, t = docs["daemon"], docs["trl"]
lines = []
if d:
    build = d.get("build") or {}
    lines.append("memprofd %s (LibTorch %s) on %s, model %s (%s parameters), batch %d x %d, %d steps per run" % (
        build.get("version", "?"), build.get("torch_version", "?"), d["device"], d["preset"],
        "{:,}".format(d["num_parameters"]), d["batch_size"], d["seq_len"], d["steps"]))
width = max([len(r[0]) for r in rows] + [20])
lines.append("%-*s  %-4s  %s" % (min(width, 58), "check", "", "detail"))
for name, ok, detail in rows:
    lines.append("%-*s  %-4s  %s" % (min(width, 58), name[:58], "ok" if ok else "FAIL", detail[:150]))

figures = []  # (side, ckpt, offload, summary)
if d:
    for name, run in d["runs"].items():
        if "summary" in run:
            ckpt, target = name.split("-")[:2]
            figures.append(("memprofd", ckpt, target, run["summary"]))
if t:
    for name, m in t["modes"].items():
        ckpt, off = name.split("-")[:2]
        if "skipped" in m:
            continue
        figures.append(("transformers" + ("+TRL" if off == "trl" else ""), ckpt,
                        "OffloadActivations" if off == "trl" else "off", m))
if figures:
    lines.append("")
    lines.append("%-16s %-6s %-18s %9s %12s %15s %14s  %s" % (
        "side", "ckpt", "offload", "step s", "peak alloc", "resident saved", "moved out", "loss first -> last"))
    for side, ckpt, off, s in figures:
        lines.append("%-16s %-6s %-18s %9.3f %12s %15s %14s  %.4f -> %.4f" % (
            side, "on" if ckpt == "ckpt" else "off", off, s["step_seconds"], size(s["peak_allocated_bytes"]),
            size(s["peak_resident_saved_bytes"]), size(s["bytes_out"]), s["first_loss"], s["last_loss"]))


def ratio(a, b):
    return "%.2fx" % (a / b) if a is not None and b else "n/a"


ratios = []
if d and t:
    offload_target = "host" if d["device"].startswith("cuda") else "disk"
    for ckpt in ("ckpt", "nockpt"):
        for ours, theirs, label in (("%s-%s" % (ckpt, offload_target), "%s-trl" % ckpt,
                                     "offload %s vs TRL" % offload_target),
                                    ("%s-off" % ckpt, "%s-none" % ckpt, "no offloading")):
            a = d["runs"].get(ours, {}).get("summary")
            b = t["modes"].get(theirs)
            if a and b:
                ratios.append("ckpt %-3s %-22s step %s  peak %s  resident %s  moved %s" % (
                    "on" if ckpt == "ckpt" else "off", label + ":",
                    ratio(a["step_seconds"], b["step_seconds"]),
                    ratio(a["peak_allocated_bytes"], b["peak_allocated_bytes"]),
                    ratio(a["peak_resident_saved_bytes"], b["peak_resident_saved_bytes"]),
                    ratio(a["bytes_out"], b["bytes_out"])))
if ratios:
    lines.append("")
    lines.append("memprofd / transformers (same model, batch and checkpointing; < 1 is memprofd smaller or faster):")
    lines += ["  " + r for r in ratios]
# ---- the speed parts: memprofd vs transformers vs transformers + Liger ----
DENSE_BF16_PEAK = [  # FLOP/s, dense (no sparsity), from NVIDIA's datasheets
    ("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H100", 989.4e12), ("H200", 989.4e12),
    ("B200", 2250e12), ("A100", 312e12), ("L40S", 362.05e12)]


def flops_per_token(c, seq):
    g = {k: int(c[k]) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                "num_key_value_heads", "intermediate_size", "vocab_size")}
    g["head_dim"] = int(c.get("head_dim") or 0)
    hidden, layers = g["hidden_size"], g["num_hidden_layers"]
    heads, kv = g["num_attention_heads"], g["num_key_value_heads"]
    head_dim = g.get("head_dim") or hidden // heads
    per_layer = (2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim +
                 3 * hidden * g["intermediate_size"])
    n = layers * per_layer + g["vocab_size"] * hidden
    return 6.0 * n + 12.0 * layers * hidden * seq


sp, sh = docs["speed"], docs["speed_hf"]
speed_rows = []  # (side, precision, summary)
if sp:
    for name, run in sp["runs"].items():
        if "summary" in run:
            speed_rows.append(("memprofd", run["summary"]["precision"], run["summary"]))
if sh:
    for name, m in sh["modes"].items():
        side = "transformers+Liger" if name.split("-")[1] == "liger" else "transformers"
        if "skipped" in m:
            lines.append("speed: %s (%s): %s" % (side, name, m["skipped"]))
            continue
        speed_rows.append((side, m["precision"], m))
if sp and speed_rows:
    name = (sh or {}).get("device_name", "cpu")
    peak = next((f for key, f in DENSE_BF16_PEAK if key in name), None)
    fpt = flops_per_token(sp["config"], sp["seq_len"])
    lines.append("")
    lines.append("speed: %s, batch %d x %d, checkpointing on, attention %s; MFU against %s" % (
        sp["preset"], sp["batch_size"], sp["seq_len"], sp.get("attn", "?"),
        "%s's dense bf16 peak, %.0f TFLOP/s" % (name, peak / 1e12) if peak else "n/a (%s)" % name))
    lines.append("%-20s %-9s %9s %11s %7s %12s" % ("side", "precision", "step s", "tokens/s", "MFU",
                                                   "peak alloc"))
    by = {}
    for side, precision, m in speed_rows:
        by[(side, precision)] = m
        tps = m["tokens_per_second"]
        lines.append("%-20s %-9s %9.3f %11.0f %7s %12s" % (
            side, "bf16" if precision == "bf16" else "float32", m["step_seconds"], tps,
            "%.1f%%" % (100 * tps * fpt / peak) if peak else "n/a", size(m["peak_allocated_bytes"])))
    for precision in ("no", "bf16"):
        ours, hf, lg = (by.get((s, precision)) for s in ("memprofd", "transformers", "transformers+Liger"))
        if not ours:
            continue
        label = "bf16" if precision == "bf16" else "float32"
        if hf:
            r = ours["step_seconds"] / hf["step_seconds"]
            lines.append("  %s: step memprofd/transformers %.3f (target <= 0.97: %s)" % (
                label, r, "met" if r <= 0.97 else "missed"))
        if lg:
            a, b = ours["peak_allocated_bytes"], lg["peak_allocated_bytes"]
            lines.append("  %s: step memprofd/transformers+Liger %.3f; peak %s vs %s (target <=: %s)" % (
                label, ours["step_seconds"] / lg["step_seconds"], size(a), size(b),
                "met" if a is not None and b is not None and a <= b else "n/a" if a is None or b is None
                else "missed"))
        if peak and precision == "bf16":
            mfu = ours["tokens_per_second"] * fpt / peak
            lines.append("  bf16: memprofd MFU %.1f%% (target >= 45%%: %s)" % (
                100 * mfu, "met" if mfu >= 0.45 else "missed"))
h = docs["hf"]
if h:
    lines.append("snapshot loss: transformers %.6f, memprofd %s (relative difference %s)" % (
        h["loss"], h["daemon_loss"], "%.1e" % h["relative_difference"] if h["relative_difference"] is not None
        else "n/a"))
failed = [r for r in rows if not r[1]]
lines.append("RESULT: %s (%d checks, %d failed)" % ("FAIL" if failed or not rows else "PASS", len(rows), len(failed)))
if skipped_names:
    print("skipped tests: " + ", ".join(skipped_names))
if failed_names:
    print("failed tests: " + ", ".join(failed_names))
print("\n".join(lines))
json.dump({"rows": rows, "figures": figures, "ratios": ratios, "skipped_tests": skipped_names, "failed_tests": failed_names,
           "docs": docs}, open(out_path, "w"), indent=1)
sys.exit(1 if failed or not rows else 0)
