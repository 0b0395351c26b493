"""Independent reader of a memprofd snapshot: standard library and numpy only.

usage: check_snapshot.py SNAPSHOT_DIR EXPECTED_DIR

Parses every *.safetensors file of SNAPSHOT_DIR byte by byte and checks the
format (length prefix, '{', space padding to 8, exact entry fields, metadata
{"format": "pt"}, reference writer order, back-to-back offsets, no trailing
bytes), the Hugging Face layout (model.safetensors alone, or
model-0000K-of-0000N.safetensors with model.safetensors.index.json written as
json.dumps(indent=2, sort_keys=True)) and the values against EXPECTED_DIR,
written by the C++ test: expected.json lists {name, dtype, shape, values}
where values names a little-endian float64 file of the expected values.
BF16 is decoded by hand. Prints "OK <n> tensors" or the first problem.
"""
import json
import os
import re
import struct
import sys

import numpy as np

ORDER = ["BOOL", "U8", "I8", "I16", "F16", "BF16", "I32", "F32", "F64", "I64"]
RANK = {"BOOL": 0, "U8": 4, "I8": 5, "I16": 11, "F16": 13, "BF16": 14, "I32": 15,
        "F32": 17, "F64": 19, "I64": 20}
NP = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
      "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "u1"}
SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
        "I8": 1, "U8": 1, "BOOL": 1}


class Bad(Exception):
    pass


def no_dupes(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise Bad("duplicate keys %r" % keys)
    return dict(pairs)


def decode(dtype, raw):
    if dtype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    arr = np.frombuffer(raw, dtype=NP[dtype])
    if dtype == "BOOL":
        if np.any(arr > 1):
            raise Bad("BOOL byte other than 0/1")
    return arr.astype(np.float64)


def read_file(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise Bad("%s: shorter than 8 bytes" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if n % 8 != 0:
        raise Bad("%s: header length %d is not a multiple of 8" % (path, n))
    text = data[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        raise Bad("%s: header does not start with '{'" % path)
    stripped = text.rstrip(" ")
    if not stripped.endswith("}") or len(text) - len(stripped) >= 8:
        raise Bad("%s: bad padding" % path)
    header = json.loads(text, object_pairs_hook=no_dupes)
    if header.get("__metadata__") != {"format": "pt"}:
        raise Bad("%s: __metadata__ is %r" % (path, header.get("__metadata__")))
    entries = [(k, v) for k, v in header.items() if k != "__metadata__"]
    # Reference writer order: dtype descending, then name.
    want = sorted(entries, key=lambda kv: (-RANK[kv[1]["dtype"]], kv[0].encode()))
    by_offset = sorted(entries, key=lambda kv: tuple(kv[1]["data_offsets"]))
    if [k for k, _ in want] != [k for k, _ in by_offset]:
        raise Bad("%s: tensors not in reference order" % path)
    start = 8 + n
    pos = 0
    out = {}
    for name, info in by_offset:
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise Bad("%s: %s has fields %r" % (path, name, sorted(info)))
        b, e = info["data_offsets"]
        if b != pos:
            raise Bad("%s: %s begins at %d, expected %d" % (path, name, b, pos))
        numel = 1
        for d in info["shape"]:
            numel *= d
        if e - b != numel * SIZE[info["dtype"]]:
            raise Bad("%s: %s has %d bytes for %d elements" % (path, name, e - b, numel))
        pos = e
        out[name] = (info["dtype"], info["shape"], data[start + b:start + e])
    if len(data) != start + pos:
        raise Bad("%s: %d bytes, expected %d" % (path, len(data), start + pos))
    return out, pos


def main():
    snap, expected_dir = sys.argv[1], sys.argv[2]
    names = sorted(os.listdir(snap))
    files = [f for f in names if f.endswith(".safetensors")]
    tensors, where, total = {}, {}, 0
    for f in files:
        content, size = read_file(os.path.join(snap, f))
        total += size
        for k, v in content.items():
            if k in tensors:
                raise Bad("%s in two files" % k)
            tensors[k] = v
            where[k] = f
    if files == ["model.safetensors"]:
        if any(f.endswith(".index.json") for f in names):
            raise Bad("single-file snapshot with an index")
    else:
        count = len(files)
        pattern = ["model-%05d-of-%05d.safetensors" % (i + 1, count) for i in range(count)]
        if files != pattern:
            raise Bad("shard files %r" % files)
        with open(os.path.join(snap, "model.safetensors.index.json")) as f:
            text = f.read()
        index = json.loads(text)
        if text != json.dumps(index, indent=2, sort_keys=True) + "\n":
            raise Bad("index not written with indent=2, sort_keys=True")
        if index["metadata"]["total_size"] != total:
            raise Bad("total_size %d != %d" % (index["metadata"]["total_size"], total))
        if index["weight_map"] != where:
            raise Bad("weight_map does not match the files")
    manifest_path = os.path.join(snap, "memprofd_manifest.json")
    if not os.path.exists(manifest_path):
        raise Bad("no memprofd_manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    listed = {m["name"]: m["bytes"] for m in manifest["files"]}
    actual = {n: os.path.getsize(os.path.join(snap, n)) for n in names
              if n != "memprofd_manifest.json"}
    if listed != actual:
        raise Bad("manifest files %r != directory %r" % (listed, actual))
    if manifest["total_size"] != total or manifest["num_shards"] != len(files):
        raise Bad("manifest total_size/num_shards do not match the files")
    if manifest["bytes_written"] != sum(actual.values()):
        raise Bad("manifest bytes_written")
    with open(os.path.join(expected_dir, "expected.json")) as f:
        expected = json.load(f)
    if sorted(t["name"] for t in expected["tensors"]) != sorted(tensors):
        raise Bad("tensor names %r != expected %r" %
                  (sorted(tensors), sorted(t["name"] for t in expected["tensors"])))
    for t in expected["tensors"]:
        dtype, shape, raw = tensors[t["name"]]
        if dtype != t["dtype"] or shape != t["shape"]:
            raise Bad("%s: %s%r, expected %s%r" % (t["name"], dtype, shape, t["dtype"], t["shape"]))
        got = decode(dtype, raw)
        want = np.fromfile(os.path.join(expected_dir, t["values"]), dtype="<f8")
        if not np.array_equal(got, want, equal_nan=True):
            raise Bad("%s: values differ (first %r vs %r)" % (t["name"], got[:4], want[:4]))
    if "config.json" in names and "torch_dtype" in expected:
        with open(os.path.join(snap, "config.json")) as f:
            if json.load(f).get("torch_dtype") != expected["torch_dtype"]:
                raise Bad("config.json torch_dtype")
    print("OK %d tensors" % len(tensors))


if __name__ == "__main__":
    try:
        main()
    except (Bad, KeyError, ValueError, OSError) as e:
        print("FAIL:", e)
        sys.exit(1)
