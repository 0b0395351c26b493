"""Checks a memory_viz pickle written by memprofd the way PyTorch's viewer
(torch/utils/viz/MemoryViz.js) reads it, without importing torch:

  check_memory_viz.py FILE          validate, print a JSON summary
  check_memory_viz.py FILE --torch  also feed torch.cuda._memory_viz helpers

Exit status 1 with a message on the first problem."""
import json
import pickle
import pickletools
import sys

TRACE_ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc",
                 "segment_free", "segment_map", "segment_unmap", "snapshot", "oom"}
BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}
SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "segment_pool_id",
                "is_expandable", "frames", "blocks"}


# The opcodes MemoryViz.js's unpickle() implements (torch/utils/viz/MemoryViz.js).
VIEWER_OPCODES = {"PROTO", "STOP", "MARK", "EMPTY_DICT", "SETITEMS", "SETITEM", "DICT",
                  "EMPTY_LIST", "APPENDS", "APPEND", "LIST", "TUPLE", "TUPLE1", "TUPLE2",
                  "TUPLE3", "EMPTY_TUPLE", "BINUNICODE", "SHORT_BINUNICODE", "BININT",
                  "BININT1", "BININT2", "LONG1", "BINFLOAT", "NEWTRUE", "NEWFALSE", "NONE",
                  "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "MEMOIZE", "FRAME"}


class Bad(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Bad(msg)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_frames(frames, where):
    need(isinstance(frames, list), where + ": frames not a list")
    for f in frames:
        need(isinstance(f, dict), where + ": frame not a dict")
        need(isinstance(f.get("filename"), str), where + ": frame filename")
        need(is_int(f.get("line")), where + ": frame line")
        need(isinstance(f.get("name"), str), where + ": frame name")


def check(d):
    need(isinstance(d, dict), "top level is not a dict")
    need(set(d) >= {"segments", "device_traces", "allocator_settings"},
         "top-level keys: %r" % sorted(d))
    need(isinstance(d["allocator_settings"], dict), "allocator_settings not a dict")
    traces = d["device_traces"]
    need(isinstance(traces, list) and all(isinstance(t, list) for t in traces),
         "device_traces is not a list of lists")
    segments = d["segments"]
    need(isinstance(segments, list), "segments not a list")

    live = {}  # device -> {addr: requested size}
    pending_live = {}  # device -> {addr} of blocks whose free waits on a stream
    seg_ranges = {}  # device -> [(start, end)]
    for i, seg in enumerate(segments):
        w = "segment %d" % i
        need(isinstance(seg, dict), w + " not a dict")
        need(SEGMENT_KEYS <= set(seg), w + " lacks %r" % (SEGMENT_KEYS - set(seg)))
        need("category" not in seg, w + " has category")
        for k in ("device", "address", "total_size", "stream"):
            need(is_int(seg[k]), w + ": %s not an int" % k)
        need(0 <= seg["device"] < len(traces), w + ": device %d has no trace list" % seg["device"])
        need(seg["total_size"] > 0, w + ": empty")
        check_frames(seg["frames"], w)
        addr = seg["address"]
        for j, b in enumerate(seg["blocks"]):
            bw = "%s block %d" % (w, j)
            need(is_int(b.get("size")) and b["size"] > 0, bw + ": size")
            need(b.get("state") in BLOCK_STATES, bw + ": state %r" % b.get("state"))
            need(is_int(b.get("requested_size")), bw + ": requested_size")
            need(b.get("address") == addr, bw + ": address does not tile the segment")
            check_frames(b.get("frames"), bw)
            if b["state"] == "active_allocated":
                live.setdefault(seg["device"], {})[addr] = b["requested_size"]
            elif b["state"] == "active_pending_free":
                pending_live.setdefault(seg["device"], set()).add(addr)
            addr += b["size"]
        need(addr == seg["address"] + seg["total_size"], w + ": blocks do not sum to total_size")
        seg_ranges.setdefault(seg["device"], []).append(
            (seg["address"], seg["address"] + seg["total_size"]))

    summary = {"devices": len(traces), "segments": len(segments), "allocs": 0,
               "frees": 0, "unmatched_frees": 0, "open_allocs": 0,
               "live_bytes": {}, "first_alloc_frame": "", "first_alloc_module": "",
               "first_alloc_op": "", "categories": [], "allocs_with_module": 0,
               "allocs_with_aten_op": 0, "allocs_with_backward_op": 0,
               "allocs_named_parameters": 0, "reserved_bytes": {}}
    categories = set()
    for seg in segments:
        summary["reserved_bytes"][str(seg["device"])] = (
            summary["reserved_bytes"].get(str(seg["device"]), 0) + seg["total_size"])
    for dev, trace in enumerate(traces):
        open_allocs = {}
        pending_free = {}  # addr -> event index of a free_requested not yet completed
        freed = set()
        # The segment view replays the trace backwards from the segments:
        # every block event must fall in a segment that exists at that point.
        segs = set(seg_ranges.get(dev, []))
        for k in range(len(trace) - 1, -1, -1):
            e = trace[k]
            w = "device %d event %d" % (dev, k)
            need(isinstance(e, dict), w + " not a dict")
            a = e.get("action")
            if a == "segment_alloc":
                r = (e["addr"], e["addr"] + e["size"])
                need(r in segs, w + ": segment_alloc of a segment that is not there later")
                segs.discard(r)
            elif a == "segment_free":
                segs.add((e["addr"], e["addr"] + e["size"]))
            elif a in ("alloc", "free_requested", "free_completed"):
                need(any(s <= e["addr"] < t for s, t in segs),
                     w + ": address %#x in no segment" % e["addr"])
        for k, e in enumerate(trace):
            w = "device %d event %d" % (dev, k)
            need(e.get("action") in TRACE_ACTIONS, w + ": action %r" % e.get("action"))
            if "category" in e:
                need(isinstance(e["category"], str), w + ": category not a string")
                categories.add(e["category"])
            for key in ("addr", "size", "stream", "time_us"):
                need(is_int(e.get(key)), w + ": %s not an int" % key)
            check_frames(e.get("frames"), w)
            a = e["action"]
            if a == "alloc":
                need(e["addr"] not in open_allocs, w + ": alloc of a live address")
                open_allocs[e["addr"]] = e["size"]
                freed.discard(e["addr"])
                summary["allocs"] += 1
                if e["frames"] and e["frames"][0]["filename"].startswith("model."):
                    summary["allocs_with_module"] += 1
                if e["frames"] and e["frames"][0]["name"].startswith("aten::"):
                    summary["allocs_with_aten_op"] += 1
                if e["frames"] and "Backward" in e["frames"][0]["name"]:
                    summary["allocs_with_backward_op"] += 1
                if (e.get("category") == "parameters" and e["frames"]
                        and e["frames"][0]["filename"].endswith(".weight")):
                    summary["allocs_named_parameters"] += 1
                if not summary["first_alloc_frame"] and e["frames"]:
                    summary["first_alloc_frame"] = e["frames"][-1]["name"]
                    summary["first_alloc_module"] = e["frames"][0]["filename"]
                    summary["first_alloc_op"] = e["frames"][0]["name"]
            elif a == "free_requested":
                # Completed at once, or later when the block was used on
                # another stream (record_stream): the caching allocator waits
                # for that stream's events first. Either way before the
                # address is allocated again.
                need(e["addr"] not in pending_free, w + ": free_requested twice")
                pending_free[e["addr"]] = k
            elif a == "free_completed":
                need(pending_free.pop(e["addr"], None) is not None
                     or e["addr"] not in open_allocs,
                     w + ": free_completed of a block with no free_requested")
                summary["frees"] += 1
                if e["addr"] in open_allocs:
                    need(open_allocs.pop(e["addr"]) == e["size"], w + ": free size != alloc size")
                else:
                    summary["unmatched_frees"] += 1
                freed.add(e["addr"])
        # A free still pending when the trace ends is a block the segments
        # show as active_pending_free (its stream's work not done yet).
        for addr, k in pending_free.items():
            need(addr in pending_live.get(dev, set()),
                 "device %d event %d: free_requested never completed, and the block is not "
                 "pending free in the segments" % (dev, k))
        dev_live = live.get(dev, {})
        for addr, size in open_allocs.items():
            need(dev_live.get(addr) == size,
                 "device %d: alloc %#x never freed but not live in segments" % (dev, addr))
        for addr in freed:
            need(addr not in dev_live, "device %d: %#x freed but live in segments" % (dev, addr))
        summary["open_allocs"] += len(open_allocs)
        summary["live_bytes"][str(dev)] = sum(dev_live.values())
    # MemoryViz.js pushes onto `snapshot.categores` (sic) when some event has
    # a category but none is "unknown": a TypeError that blanks the viewer.
    need(not categories or "unknown" in categories,
         "events carry categories but none is 'unknown' (MemoryViz.js's categores typo)")
    summary["categories"] = sorted(categories)
    # The CPU is the last device: its segments are its live blocks.
    cpu = str(len(traces) - 1)
    summary["cpu_reserved_minus_live"] = (
        summary["reserved_bytes"].get(cpu, 0) - summary["live_bytes"].get(cpu, 0))
    return summary


def check_with_torch(d):
    """The helpers behind `python -m torch.cuda._memory_viz` (torch >= 2.6)."""
    import torch.cuda._memory_viz as mv
    # segsum walks every segment's blocks; its first total is the reserved bytes.
    summary = mv.segsum(d)
    need(("total_reserved: %s" % mv.Bytes(sum(s["total_size"] for s in d["segments"])))
         in summary, "torch segsum's total_reserved differs:\n" + summary)
    need(isinstance(mv.trace(d), str), "torch trace")
    for fn in (mv.segments, mv.memory):
        out = fn(d, format_flamegraph=lambda lines: lines)
        need(all(s["blocks"] == [] for s in d["segments"]) or out, fn.__name__ + " empty")
    for fn in (mv.trace_plot, mv.segment_plot):
        html = fn(d)
        need(isinstance(html, str) and "<html" in html.lower(), fn.__name__ + " gave no HTML")


def main():
    try:
        data = open(sys.argv[1], "rb").read()
        need(data[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04"), "not protocol 2-4")
        for op, _, pos in pickletools.genops(data):
            need(op.name in VIEWER_OPCODES, "opcode %s at %d unknown to the viewer" % (op.name, pos))
        d = pickle.loads(data)
        summary = check(d)
        if "--torch" in sys.argv[2:]:
            check_with_torch(d)
            summary["torch_ok"] = True
    except Bad as e:
        print("BAD: " + str(e))
        return 1
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
