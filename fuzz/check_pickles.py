"""Checks the pickles pickle_fuzz wrote (MEMPROFD_FUZZ_PICKLE_DIR): each must
disassemble with pickletools using only the opcodes PyTorch's MemoryViz.js
unpickler knows, load with pickle.loads (importing nothing), and equal the
value the fuzz program meant (<n>.json, see pickle_fuzz.cc). Strings that were
not valid UTF-8 must load as str holding the same valid characters.

Usage: check_pickles.py DIR   (exit 0 when every pickle passes)"""
import io
import json
import os
import pickle
import pickletools
import struct
import sys

ALLOWED = {"PROTO", "STOP", "MARK", "EMPTY_DICT", "SETITEMS", "EMPTY_LIST",
           "APPENDS", "TUPLE2", "BINUNICODE", "BININT1", "BININT2", "BININT",
           "LONG1", "BINFLOAT", "NEWTRUE", "NEWFALSE", "NONE", "BINPUT",
           "LONG_BINPUT", "BINGET", "LONG_BINGET"}


class Invalid(str):
    """An expected string whose bytes were not valid UTF-8 (the valid
    characters only)."""


class Items(list):
    """An expected dict: its (key, value) items in write order."""


def expected(v):
    if v is None or isinstance(v, bool):
        return v
    (kind, x), = v.items()
    if kind == "i":
        return int(x)
    if kind == "f":
        return struct.unpack(">d", bytes.fromhex(x))[0]
    if kind == "s":
        raw = bytes.fromhex(x)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return Invalid(raw.decode("utf-8", "ignore"))
    if kind == "l":
        return [expected(e) for e in x]
    if kind == "t":
        return tuple(expected(e) for e in x)
    if kind == "d":
        return Items((expected(k), expected(val)) for k, val in x)
    raise ValueError("unknown kind " + kind)


def same(want, got):
    if isinstance(want, Invalid):
        return isinstance(got, str) and got.replace("\ufffd", "") == want.replace("\ufffd", "")
    if isinstance(want, float):
        return isinstance(got, float) and struct.pack(">d", want) == struct.pack(">d", got)
    if isinstance(want, Items):
        if not isinstance(got, dict):
            return False
        if any(isinstance(k, Invalid) for k, _ in want):
            # Replaced key bytes may merge keys: check the count bound only.
            return len(got) <= len(want)
        merged = {}
        for k, val in want:  # later keys win, as in pickle's SETITEMS
            merged[k] = val
        return set(merged) == set(got) and all(same(merged[k], got[k]) for k in merged)
    if isinstance(want, (list, tuple)):
        return type(got) is type(want) and len(got) == len(want) and all(
            same(a, b) for a, b in zip(want, got))
    return type(want) is type(got) and want == got


def check(path):
    data = open(path, "rb").read()
    for op, _, _ in pickletools.genops(data):
        if op.name not in ALLOWED:
            return "opcode %s" % op.name
    pickletools.dis(data, out=io.StringIO())
    got = pickle.loads(data)
    with open(path[:-len(".pickle")] + ".json") as f:
        want = expected(json.load(f))
    if not same(want, got):
        return "value differs: got %r, want %r" % (got, want)
    return None


def main():
    d = sys.argv[1]
    names = sorted(n for n in os.listdir(d) if n.endswith(".pickle"))
    failures = 0
    for n in names:
        try:
            err = check(os.path.join(d, n))
        except Exception as e:  # any load failure is a failure of the writer
            err = "%s: %s" % (type(e).__name__, e)
        if err:
            failures += 1
            print("%s: %s" % (n, err))
    print("check_pickles: %d pickles, %d failures" % (len(names), failures))
    return 1 if failures or not names else 0


if __name__ == "__main__":
    sys.exit(main())
