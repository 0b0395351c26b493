#!/usr/bin/env python3
"""Pre-flight check before a training: does the model the daemon holds fit a
memory budget? Exits 0 when it does, 1 when it does not (or the daemon says
no), 2 for bad arguments.

    preflight.py 127.0.0.1:50051 --budget 80GB

memprofd has no planning RPC yet; when one lands, this example will ask it
for the plan of the intended training and compare the plan's peak with the
budget. Until then it checks what the API already tells: DescribeModel's
parameter bytes, and the model states AdamW training keeps besides them
(gradients and two moments, each the size of the parameters: 4x in all, the
lower bound DeepSpeed's estimate_zero*_model_states_mem_needs and
accelerate's estimate-memory start from), against the budget. Activations
and temporaries come on top; the last step's measured peak
(GetMemoryStats), when the daemon has trained, is printed beside it.
"""

import argparse
import re
import sys

import memprofd_client as mc

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text):
    """'80GB' (decimal), '16GiB' (binary) or a plain number of bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError("not a size: %r (e.g. 80GB, 16GiB, 1000000)" % text)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def human(n):
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= size:
            return "%.2f %s" % (n / size, unit)
    return "%d B" % n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("addr", help="the daemon's gRPC address, host:port")
    p.add_argument("--budget", type=parse_bytes, required=True,
                   help="device memory the training may use (80GB, 16GiB, bytes)")
    p.add_argument("--token_file", help="file whose first line is the bearer token "
                   "(else $MEMPROFD_TOKEN)")
    p.add_argument("--tls_ca", help="PEM root certificates: use TLS")
    args = p.parse_args(argv)

    with mc.Client(args.addr, token_file=args.token_file, tls_ca=args.tls_ca) as client:
        model = client.describe_model()
        stats = client.memory()
    params = model.parameter_bytes  # unique storages: tied weights count once
    # AdamW: a gradient and two moments per parameter, each of its dtype.
    states = 4 * params
    print("model:               %s (%s parameters) on %s" % (model.source,
                                                             f"{model.num_parameters:,}",
                                                             model.device))
    print("parameters:          %s" % human(params))
    print("model states (AdamW): %s  (parameters + gradients + 2 moments)" % human(states))
    peaks = [p.peak_bytes for p in stats.last_step_phase_peaks]
    if peaks:
        print("last step's peak:    %s (measured)" % human(max(peaks)))
    print("budget:              %s" % human(args.budget))
    if states > args.budget:
        print("refused: the model states alone need %s more than the budget"
              % human(states - args.budget))
        return 1
    print("fits: %s left for activations and temporaries" % human(args.budget - states))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except mc.MemprofdError as e:
        print("preflight: %s" % e, file=sys.stderr)
        sys.exit(1)
