"""The GPU run kit's memory-history check: memprofd's memory_viz pickle (from
`memprofctl memory dump -o`) read by PyTorch's own torch.cuda._memory_viz, as
`python -m torch.cuda._memory_viz stats|trace|segments|trace_plot` would.

  check_memory_viz.py PICKLE OUT.json [--expect_cuda]

The daemon writes CUDA devices first (device_traces[0] is cuda:0) and its CPU
allocator's history as the last device. With --expect_cuda (a daemon on
cuda:0), the CUDA caching allocator's own trace must be there: allocations on
device 0 and device-0 segments. Writes a summary and the checks to OUT.json.
"""
import json
import pickle
import sys

import torch.cuda._memory_viz as mv

path, out_path = sys.argv[1:3]
expect_cuda = "--expect_cuda" in sys.argv[3:]
data = pickle.load(open(path, "rb"))
checks = []


def check(name, ok, detail=""):
    checks.append({"name": name, "ok": bool(ok), "detail": str(detail)})
    print("%-5s %s %s" % ("ok" if ok else "FAIL", name, detail), flush=True)


traces = data["device_traces"]
segments = data["segments"]
per_device = []
for d, trace in enumerate(traces):
    per_device.append({
        "device": d, "events": len(trace),
        "allocs": sum(e["action"] == "alloc" for e in trace),
        "segments": sum(s["device"] == d for s in segments),
        "segment_bytes": sum(s["total_size"] for s in segments if s["device"] == d)})
summary = {"devices": per_device, "segments": len(segments)}
check("the pickle has traces", traces and sum(d["events"] for d in per_device) > 0,
      "; ".join("device %(device)d: %(events)d events, %(allocs)d allocs, %(segments)d segments" % d
                for d in per_device))
# What the viewer's command line prints or draws, each from the same data.
stats = mv.segsum(data)  # "stats": the segments' fill, block by block
check("torch.cuda._memory_viz stats", isinstance(stats, str) and stats, "%d chars" % len(stats))
text = mv.trace(data)  # "trace": the events, newest last
check("torch.cuda._memory_viz trace", isinstance(text, str), "%d lines" % text.count("\n"))
flame = mv.segments(data, format_flamegraph=lambda lines: lines)  # "segments"
check("torch.cuda._memory_viz segments", isinstance(flame, str), "%d lines" % flame.count("\n"))
html = mv.trace_plot(data)  # "trace_plot": the viewer's page, every device in it
check("torch.cuda._memory_viz trace_plot", isinstance(html, str) and html, "%d bytes of html" % len(html))
if expect_cuda:
    cuda = per_device[0] if len(per_device) > 1 else None
    check("CUDA allocator trace on cuda:0", cuda and cuda["allocs"] > 0 and cuda["segments"] > 0,
          cuda if cuda else "only %d device trace(s)" % len(per_device))
json.dump({"summary": summary, "checks": checks}, open(out_path, "w"), indent=1)
sys.exit(0 if all(c["ok"] for c in checks) else 1)
