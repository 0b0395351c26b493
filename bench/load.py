"""Load on a training daemon (issue 15): prints figures, is not a test.

N concurrent clients (default 64) for T minutes (default 10) against one
memprofd that trains the whole time: GetStatus, GetMemoryStats, /metrics
scrapes, StreamStepReports and WatchOperation streams (a few messages each,
then cancelled), and DumpMemoryHistory (read to the end; one client in 16,
so that the daemon's cap of 4 concurrent dumps is never what answers).
Each client calls again as soon as it is answered (closed loop: the daemon
is saturated, and latency is its queue over its rate), or, with --interval,
every S seconds, as an orchestrator that polls does.
Prints p50 and p99 latency per RPC, errors, the daemon's RSS slope (least
squares over samples every 5 s, after the first minute's warm-up), and the
training's tokens/s before and during the load.

Each row has two views of one RPC: the client's (from the call to the
answer, in the client's process: with 16 client threads in one interpreter
that includes each thread's wait for the GIL) and the daemon's own handler
time (its memprofd_rpc_duration_seconds histogram, read before and after the
load: the bound of the bucket that holds p50 / p99). A lone probe process
calls GetStatus every --probe_interval seconds beside the load, and is
reported as its own row: the latency a client that is not starved sees.

  /opt/memprofd/venv/bin/python bench/load.py [--clients 64] [--minutes 10]
      [--seconds S] [--build build] [--client python|cpp] [--processes 4]
      [--client_nice N] [--bulk_nice N] [--interval S] [--dump_every N]
      [--kinds GetStatus,metrics,...] [--idle]

Python clients run in --processes processes (threads in each), so that one
Python interpreter's lock does not become the bottleneck being measured; on a
machine with few cores the clients still compete with the training for the
CPU, which the table's header says (uptime). --client cpp runs the same
clients, calls and pacing in C++ instead (build/bench/load_client: a thread
and a connection per client, ~0.1 ms of CPU per call instead of ~1 ms), so
that the load generator's own CPU time is not what the figures measure.
Both probes run in every run, the Python one and a C++ one (each alone in
its process), side by side whichever language the load is in.
"""

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))


def percentile(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


KINDS = ("GetStatus", "GetMemoryStats", "metrics", "StreamStepReports", "WatchOperation")
# The calls that need a running training (their streams follow its operation).
TRAINING_KINDS = ("StreamStepReports", "WatchOperation")


def client_process(addr, metrics_port, op_id, first, count, deadline, queue, nice=0,
                   interval=0.0, dump_every=16, kinds=KINDS):
    if nice:
        os.nice(nice)
    import grpc
    import harness
    from harness import pb

    channel = grpc.insecure_channel(addr)
    stub = harness.memprofd_pb2_grpc.MemprofdStub(channel)
    lat = {}
    errors = {}

    def record(name, start, ok, detail=""):
        lat.setdefault(name, []).append(time.perf_counter() - start)
        if not ok:
            errors.setdefault(name, []).append(detail)

    def run(i):
        mine = list(kinds)
        if dump_every and i % dump_every == 0:
            mine.append("DumpMemoryHistory")
        k = i
        # Paced clients start at spread-out offsets, so that they do not call
        # in step; closed-loop ones (interval 0) call again as soon as answered.
        next_call = time.perf_counter() + interval * (i % 64) / 64.0
        while time.time() < deadline:
            kind = mine[k % len(mine)]
            k += 1
            if interval > 0:
                time.sleep(max(0.0, next_call - time.perf_counter()))
                next_call += interval
            start = time.perf_counter()
            try:
                if kind == "GetStatus":
                    stub.GetStatus(pb.GetStatusRequest(), timeout=30)
                elif kind == "GetMemoryStats":
                    stub.GetMemoryStats(pb.GetMemoryStatsRequest(), timeout=30)
                elif kind == "metrics":
                    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port,
                                                timeout=30) as r:
                        r.read()
                elif kind == "StreamStepReports":
                    call = stub.StreamStepReports(pb.StreamStepReportsRequest(operation_id=op_id),
                                                  timeout=60)
                    for n, _ in enumerate(call):
                        if n >= 2:
                            break
                    call.cancel()
                elif kind == "WatchOperation":
                    call = stub.WatchOperation(pb.WatchOperationRequest(id=op_id), timeout=60)
                    for n, _ in enumerate(call):
                        if n >= 2:
                            break
                    call.cancel()
                elif kind == "DumpMemoryHistory":
                    for _ in stub.DumpMemoryHistory(pb.DumpMemoryHistoryRequest(), timeout=120):
                        pass
                record(kind, start, True)
            except Exception as e:  # every failure counts, whatever its kind
                record(kind, start, False, "%s: %s" % (type(e).__name__, str(e)[:200]))

    threads = [threading.Thread(target=run, args=(first + j,)) for j in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    channel.close()
    queue.put((lat, errors))


def probe_process(addr, deadline, interval, queue):
    """One client alone in its process, one GetStatus every `interval` seconds:
    what a caller sees when its own interpreter is not starved by 15 other
    client threads (the load's rows include each client's wait for its GIL)."""
    import grpc
    import harness
    from harness import pb

    channel = grpc.insecure_channel(addr)
    stub = harness.memprofd_pb2_grpc.MemprofdStub(channel)
    lat, errors = [], []
    while time.time() < deadline:
        start = time.perf_counter()
        try:
            stub.GetStatus(pb.GetStatusRequest(), timeout=30)
        except Exception as e:  # every failure counts
            errors.append("%s: %s" % (type(e).__name__, str(e)[:200]))
        lat.append(time.perf_counter() - start)
        time.sleep(max(0.0, interval - (time.perf_counter() - start)))
    channel.close()
    row = "GetStatus (probe, Python)"
    queue.put(({row: lat}, {row: errors} if errors else {}))


def start_cpp_clients(build, addr, metrics_port, op_id, seconds, clients, interval, kinds,
                      dump_every, label="", nice=0):
    """Starts build/bench/load_client (load.py's clients in C++); its
    results come from cpp_results()."""
    args = [os.path.join(build, "bench", "load_client"), "--addr=" + addr,
            "--metrics_port=%d" % metrics_port, "--operation_id=" + op_id,
            "--clients=%d" % clients, "--seconds=%g" % seconds, "--interval=%g" % interval,
            "--kinds=" + ",".join(kinds), "--dump_every=%d" % dump_every, "--label=" + label]
    return subprocess.Popen(args, stdout=subprocess.PIPE,
                            preexec_fn=(lambda: os.nice(nice)) if nice else None)


def cpp_results(proc):
    """({row: [seconds]}, {row: [error]}) from a load_client that has ended."""
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit("load_client exited with %d" % proc.returncode)
    result = json.loads(out)
    return result["latencies"], result["errors"]


def start_training(d, pb, batch_size, seq_len):
    """Starts a training that runs until cancelled and waits for its third
    step (past the warm-up); returns its operation."""
    op = d.call("Train", pb.TrainRequest(steps=10**7, batch_size=batch_size, seq_len=seq_len))
    while d.call("GetStatus", pb.GetStatusRequest()).last_step.global_step < 3:
        time.sleep(0.2)
    return op


def rpc_histograms(d):
    """memprofd_rpc_duration_seconds by method: {method: [(le, cumulative count)]}
    (the daemon's own time in the handler, from its /metrics)."""
    out = {}
    for line in d.metrics_text().splitlines():
        if not line.startswith("memprofd_rpc_duration_seconds_bucket{"):
            continue
        labels, value = line.rsplit(" ", 1)
        fields = dict(kv.split("=", 1) for kv in labels[labels.index("{") + 1:-1].split(","))
        le = fields["le"].strip('"')
        out.setdefault(fields["method"].strip('"'), []).append(
            (float("inf") if le == "+Inf" else float(le), float(value)))
    return out


def histogram_quantile(before, after, q):
    """The upper bound of the bucket that holds quantile q of the observations
    made between two reads of one histogram; (bound, count)."""
    b = dict(before)
    buckets = sorted((le, n - b.get(le, 0.0)) for le, n in after)
    total = buckets[-1][1] if buckets else 0
    for le, n in buckets:
        if total and n >= q * total:
            return le, total
    return float("nan"), total


def tokens_per_second(d, seconds):
    from harness import pb
    first = d.call("GetStatus", pb.GetStatusRequest()).last_step
    time.sleep(seconds)
    last = d.call("GetStatus", pb.GetStatusRequest()).last_step
    steps = last.global_step - first.global_step
    return steps * last.tokens / seconds if steps > 0 else 0.0


def thread_switches(pid):
    """{thread name: [voluntary, involuntary]} context switches, summed over
    the process's live threads of that name (trailing digits dropped, so that
    numbered pool threads add up). A voluntary switch is a thread that blocked
    and so will be woken: per call, the wake-ups a call costs in the daemon."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                name = f.read().strip().rstrip("0123456789") or "?"
            counts = [0, 0]
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        counts[0] = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        counts[1] = int(line.split()[1])
        except OSError:  # the thread ended between the listing and the read
            continue
        total = out.setdefault(name, [0, 0])
        total[0] += counts[0]
        total[1] += counts[1]
    return out


def rss_slope(samples):
    """Least-squares slope of [(seconds, MiB)] in MiB per minute (nan for
    fewer than two samples)."""
    if len(samples) < 2:
        return float("nan")
    mt = sum(t for t, _ in samples) / len(samples)
    mr = sum(r for _, r in samples) / len(samples)
    den = sum((t - mt) ** 2 for t, _ in samples)
    return sum((t - mt) * (r - mr) for t, r in samples) / den * 60 if den else float("nan")


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--seconds", type=float, default=None,
                    help="the load's length in seconds (overrides --minutes)")
    ap.add_argument("--probe_interval", type=float, default=0.02,
                    help="seconds between the lone probe's GetStatus calls")
    ap.add_argument("--client_nice", type=int, default=0,
                    help="nice increment of the load's client processes (not the "
                         "probe's), to see the daemon's figures when its load "
                         "generator does not take the cores from it")
    ap.add_argument("--bulk_nice", type=int, default=0,
                    help="the daemon's --bulk_nice: its training threads' nice "
                         "value, so that its gRPC threads answer first")
    ap.add_argument("--interval", type=float, default=0.0,
                    help="seconds between one client's calls (an orchestrator that "
                         "polls); 0, the default, calls again as soon as answered "
                         "(closed loop: the daemon saturated, latency = queue / rate)")
    ap.add_argument("--dump_every", type=int, default=16,
                    help="one client in N also dumps the memory history (0: none)")
    ap.add_argument("--kinds", default=None,
                    help="comma-separated calls the clients take turns at (default: "
                         "all of them; with --idle, those that need no training); "
                         "to see which load makes a tail")
    ap.add_argument("--idle", action="store_true",
                    help="the daemon does not train: the latency floor that this "
                         "machine and these clients give, to set beside a run that "
                         "trains")
    ap.add_argument("--client", choices=("python", "cpp"), default="python",
                    help="the language of the load's clients: python (grpcio, "
                         "--processes interpreters) or cpp (build/bench/load_client)")
    ap.add_argument("--processes", type=int, default=4,
                    help="Python client processes (threads in each)")
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--batch_size", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=64)
    args = ap.parse_args()
    allowed = tuple(k for k in KINDS if not (args.idle and k in TRAINING_KINDS))
    kinds = tuple(k for k in (args.kinds or ",".join(allowed)).split(",") if k)
    if not kinds or set(kinds) - set(allowed):
        ap.error("--kinds: give some of %s" % ",".join(allowed))
    os.environ["MEMPROFD_BUILD_DIR"] = os.path.abspath(args.build)
    import harness
    from harness import pb

    d = harness.Daemon("--bulk_nice=%d" % args.bulk_nice)
    try:
        d.call("StartMemoryRecording", pb.StartMemoryRecordingRequest(max_entries=20000))
        op, baseline = None, float("nan")
        if not args.idle:
            op = start_training(d, pb, args.batch_size, args.seq_len)
            baseline = tokens_per_second(d, 20)

        seconds = args.seconds if args.seconds is not None else args.minutes * 60
        hist_before = rpc_histograms(d)
        switches_before = thread_switches(d.proc.pid)
        deadline = time.time() + seconds
        # Spawned, not forked: a gRPC channel does not survive fork (a forked
        # client's calls can fail with "Wrong file descriptor generation").
        mp = multiprocessing.get_context("spawn")
        queue = mp.Queue()
        procs, cpp, first = [], [], 0
        op_id = op.id if op else ""
        if args.client == "cpp":
            cpp.append(start_cpp_clients(args.build, d.addr, d.metrics_port, op_id, seconds,
                                         args.clients, args.interval, kinds, args.dump_every,
                                         nice=args.client_nice))
        else:
            per = [args.clients // args.processes + (1 if p < args.clients % args.processes
                                                     else 0)
                   for p in range(args.processes)]
            for count in per:
                p = mp.Process(target=client_process, args=(
                    d.addr, d.metrics_port, op_id, first, count, deadline, queue,
                    args.client_nice, args.interval, args.dump_every, kinds))
                first += count
                p.start()
                procs.append(p)
        probe = mp.Process(target=probe_process, args=(
            d.addr, deadline, args.probe_interval, queue))
        probe.start()
        procs.append(probe)
        cpp.append(start_cpp_clients(args.build, d.addr, d.metrics_port, op_id, seconds, 1,
                                     args.probe_interval, ("GetStatus",), 0, label="probe, C++"))
        samples = []  # (seconds since start, RSS MiB)
        rates = []
        start = time.time()
        while time.time() < deadline - 5:
            samples.append((time.time() - start, rss_mib(d.proc.pid)))
            if args.idle:
                time.sleep(5)
            else:
                rates.append(tokens_per_second(d, 5))
        lat, errors = {}, {}

        def merge(result):
            for into, rows in zip((lat, errors), result):
                for k, v in rows.items():
                    into.setdefault(k, []).extend(v)

        for _ in procs:
            merge(queue.get())
        for p in procs:
            p.join()
        for c in cpp:
            merge(cpp_results(c))
        hist_after = rpc_histograms(d)
        switches_after = thread_switches(d.proc.pid)
        after = float("nan")
        if op is not None:
            after = tokens_per_second(d, 10)
            d.call("CancelOperation", pb.CancelOperationRequest(id=op.id))

        warm = [(t, r) for t, r in samples if t >= min(60, seconds / 3)]
        slope = rss_slope(warm)
        # A second half flatter than the whole points to growth that levels
        # off. Neither slope tells growth per call from a warm-up when every
        # run makes the same calls: a closed-loop run, with many more calls
        # in the same time, does (README, Hardening).
        late_slope = rss_slope([(t, r) for t, r in samples if t >= seconds / 2])

        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
        print("memprofd load: %d %s clients%s (nice +%d, %s) and two probes (Python, "
              "C++), %.1f min, %s (--bulk_nice=%d); calls: %s; %d cores, load average %s"
              % (args.clients, "C++" if args.client == "cpp" else "Python",
                 " in one load_client process, a thread and connection each"
                 if args.client == "cpp" else " in %d processes" % args.processes,
                 args.client_nice,
                 "a call every %g s each" % args.interval if args.interval > 0
                 else "closed loop", seconds / 60,
                 "no training (--idle)" if args.idle else
                 "tiny preset training batch %d x %d" % (args.batch_size, args.seq_len),
                 args.bulk_nice, ",".join(kinds), os.cpu_count(),
                 " ".join(load)))
        print("client side: from the call to its answer, in the client's process; "
              "server side: the daemon's handler time (memprofd_rpc_duration_seconds, "
              "streams until they end), as the bound of the histogram bucket")
        print("%-26s %9s %9s %9s %7s %12s %12s" % ("rpc", "calls", "p50 ms", "p99 ms",
                                                   "errors", "srv p50 <=", "srv p99 <="))
        total_errors = 0
        for k in sorted(lat):
            v = lat[k]
            n_err = len(errors.get(k, []))
            total_errors += n_err
            method = k.split(" ")[0]
            srv = ["", ""]
            if method in hist_after and " " not in k:
                for i, q in enumerate((0.5, 0.99)):
                    le, _ = histogram_quantile(hist_before.get(method, []),
                                               hist_after[method], q)
                    srv[i] = "%.1f" % (1e3 * le)
            print("%-26s %9d %9.2f %9.2f %7d %12s %12s" % (
                k, len(v), 1e3 * percentile(v, 0.5), 1e3 * percentile(v, 0.99), n_err,
                srv[0], srv[1]))
        rpcs = sum(len(v) for k, v in lat.items() if not k.startswith("metrics"))
        print("daemon context switches per gRPC call (%d calls; voluntary ones are "
              "wake-ups), by thread, during the load:" % rpcs)
        for name in sorted(switches_after):
            b = switches_before.get(name, [0, 0])
            a = switches_after[name]
            if a[0] - b[0] + a[1] - b[1] > 0 and rpcs:
                print("  %-16s voluntary %7.3f  involuntary %7.3f"
                      % (name, (a[0] - b[0]) / rpcs, (a[1] - b[1]) / rpcs))
        print("errors: %d%s" % (total_errors, "".join(
            "\n  %s: %s" % (k, v[0]) for k, v in errors.items() if v)))
        print("daemon RSS: %.1f MiB at start of load, %.1f MiB at end; slope %.2f MiB/min "
              "(least squares after warm-up, %d samples), %.2f MiB/min over the second half"
              % (samples[0][1] if samples else float("nan"),
                 samples[-1][1] if samples else float("nan"), slope, len(warm), late_slope))
        during = sum(rates) / len(rates) if rates else float("nan")
        if not args.idle:
            print("training tokens/s: %.0f before the load, %.0f during (mean of 5 s "
                  "windows), %.0f after; %.2fx under load"
                  % (baseline, during, after, during / baseline if baseline else float("nan")))
    finally:
        d.close()


if __name__ == "__main__":
    main()
