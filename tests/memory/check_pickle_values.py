"""Loads a pickle written by pickle_writer_test and compares it with the
expected value. Imports nothing but the standard library (no torch)."""
import pickle
import pickletools
import sys

EXPECTED = {
    "ints": [0, 1, 255, 256, 65535, 65536, -1, -2147483648, 2147483647,
             2147483648, -2147483649, 2**63 - 1, -2**63, 2**64 - 1,
             0x7f1234567890, 128, 32768, 8388608, -129, -128, 2**31 - 1],
    "floats": [0.0, 1.5, -2.25, 1e300],
    "strs": ["", "h\u00e9llo \u2713", "a" * 300],
    "consts": [True, False, None],
    "pair": (0, 7),
    "long_list": list(range(2500)),
    "big_dict": {"k%d" % i: i for i in range(2100)},
    "shared": [[1], [1], "k5", "k2000"],
    "nested": {"a": [{"b": []}, {}], "empty": []},
}


def main():
    data = open(sys.argv[1], "rb").read()
    if data[:2] != b"\x80\x02":
        print("not protocol 2: %r" % data[:2])
        return 1
    allowed = {"PROTO", "STOP", "MARK", "EMPTY_DICT", "SETITEMS", "EMPTY_LIST",
               "APPENDS", "TUPLE2", "BINUNICODE", "BININT1", "BININT2", "BININT",
               "LONG1", "BINFLOAT", "NEWTRUE", "NEWFALSE", "NONE", "BINPUT",
               "LONG_BINPUT", "BINGET", "LONG_BINGET"}
    for op, _, _ in pickletools.genops(data):
        if op.name not in allowed:
            print("unexpected opcode " + op.name)
            return 1
    got = pickle.loads(data)
    if got != EXPECTED:
        for k in EXPECTED:
            if got.get(k) != EXPECTED[k]:
                print("mismatch in %s: got %r" % (k, got.get(k)))
        print("extra keys: %r" % (set(got) - set(EXPECTED)))
        return 1
    if got["shared"][0] is not got["shared"][1]:
        print("recalled list is a copy, not the memoized object")
        return 1
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    if not {"BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "LONG1"} <= ops:
        print("memo/long opcodes not exercised: %r" % sorted(ops))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
