"""Starts the real memprofd binary for integration tests and talks to it.

Run by the venv's Python (MEMPROFD_PYTHON: grpcio, protobuf, torch). The
client is the project's Python client package (clients/python): its source,
and the stubs the build generated for it from the .proto files alone
(build/clients-python), so this client is independent of the C++ code. The
standard health and reflection stubs come from build/python/grpcstd.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

BUILD_DIR = os.environ.get("MEMPROFD_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
SOURCE_DIR = os.environ.get("MEMPROFD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(BUILD_DIR, "python", "grpcstd"))
# The package's source before its generated stubs (memprofd_client finds its
# _proto in the second through pkgutil.extend_path), both before any
# installed copy.
for _path in (os.path.join(BUILD_DIR, "clients-python"),
              os.path.join(SOURCE_DIR, "clients", "python", "src")):
    _path = os.path.abspath(_path)
    if _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)

import grpc  # noqa: E402,F401

import memprofd_client  # noqa: E402
from memprofd_client import pb  # noqa: E402  (pb.TrainRequest, ...: every memprofd.v1 message and enum)
from memprofd_client._stubs import memprofd_pb2_grpc  # noqa: E402,F401
import health_pb2  # noqa: E402,F401
import health_pb2_grpc  # noqa: E402
import reflection_pb2  # noqa: E402,F401
import reflection_pb2_grpc  # noqa: E402

MEMPROFD = os.path.join(BUILD_DIR, "server", "memprofd")
MEMPROFCTL = os.path.join(BUILD_DIR, "client", "memprofctl")


# A model smaller than the tiny preset (its shape at a quarter of the width,
# two layers: 0.14 M parameters, 1.7 MB per checkpoint), so that tens of
# steps and several checkpoints take a second or two even on busy cores. Its
# directory holds only config.json: the daemon initialises the weights from
# --model_seed.
MICRO = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "vocab_size": 256, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": True, "torch_dtype": "float32"}
_micro_tmp = None


def micro_model_dir(name="micro", **overrides):
    """The micro model's directory, config.json only (made once per test
    process and name); `overrides` replace or add config fields, for the
    micro model in another family's shape."""
    global _micro_tmp
    if _micro_tmp is None:
        _micro_tmp = tempfile.TemporaryDirectory(prefix="memprofd-micro-")
    directory = os.path.join(_micro_tmp.name, name)
    if not os.path.isdir(directory):
        os.mkdir(directory)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(dict(MICRO, **overrides), f)
    return directory


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_samples(text):
    """The samples of a Prometheus text exposition, as (name, {label: value},
    value) in their order. Every sample memprofd serves has rank and node
    labels."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise AssertionError("not a sample line: %r" % line)
        labels = dict(_LABEL.findall(m.group(2) or ""))
        samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def metric(text, name, **labels):
    """The value of the one sample `name` of a /metrics text whose labels
    include `labels` (other labels, rank and node among them, may be there too).
    Fails when no sample or more than one matches."""
    values = [v for n, l, v in metric_samples(text)
              if n == name and all(l.get(k) == str(want) for k, want in labels.items())]
    if len(values) != 1:
        raise AssertionError("%d samples %s%s in /metrics" % (len(values), name, labels or ""))
    return values[0]


class Daemon:
    """One memprofd process on free ports, stopped by stop() or at exit.
    `preexec_fn` runs in the child before memprofd starts (resource limits)."""

    def __init__(self, *flags, token=None, start_timeout=60, preexec_fn=None, env=None,
                 wait=True, wrapper=()):
        """`env`: variables added to the environment (a rank's RANK, WORLD_SIZE...).
        `wait=False` returns at once; wait_ready() then waits for the ports (the
        ranks of a run only serve once all of them have joined). `wrapper`: a
        command memprofd runs under (["ip", "netns", "exec", "h1"])."""
        self.tmp = tempfile.TemporaryDirectory(prefix="memprofd-it-")
        self.port_file = os.path.join(self.tmp.name, "ports.json")
        self.token = token
        args = [MEMPROFD, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                "--port_file=" + self.port_file]
        if token is not None:
            token_file = os.path.join(self.tmp.name, "token")
            with open(token_file, "w") as f:
                f.write(token + "\n")
            os.chmod(token_file, 0o600)  # memprofd refuses a token others can read
            args.append("--auth_token_file=" + token_file)
            self.token_file = token_file
        args.extend(flags)
        if not any(f.startswith("--data_root") or f == "--no_data_root" for f in flags):
            # The tests' files (data, model directories) live in temporary
            # directories; the daemon opens no client-named file outside a root.
            args.append("--data_root=" + os.path.realpath(tempfile.gettempdir()))
        args = [a for a in args if a != "--no_data_root"]
        if not any(f.startswith("--report_dir") for f in flags):
            # OOM reports stay in the test's directory, not the default /tmp one.
            args.append("--report_dir=" + os.path.join(self.tmp.name, "reports"))
        self.log_path = os.path.join(self.tmp.name, "memprofd.log")
        self.log = open(self.log_path, "wb")
        child_env = None
        if env is not None:
            child_env = dict(os.environ)
            child_env.update(env)
        self.proc = subprocess.Popen(list(wrapper) + args, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=preexec_fn, env=child_env)
        self.start_timeout = start_timeout
        if wait:
            self.wait_ready()

    def wait_ready(self):
        """Waits for the port file, then connects; raises if memprofd exits first."""
        deadline = time.time() + self.start_timeout
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None:
                raise RuntimeError("memprofd exited with %d:\n%s" % (self.proc.returncode, self.output()))
            if time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("memprofd did not start:\n" + self.output())
            time.sleep(0.05)
        with open(self.port_file) as f:
            ports = json.load(f)
        self.grpc_port = ports["grpc_port"]
        self.metrics_port = ports["metrics_port"]
        self.addr = "127.0.0.1:%d" % self.grpc_port
        # The package's client with this daemon's token; `stub` is its
        # generated stub (no token: callers pass metadata()), `channel` its
        # channel, shared with the health and reflection stubs.
        self.client = memprofd_client.Client(self.addr, token=self.token or "", timeout=30)
        self.channel = self.client.channel
        self.stub = self.client.stub
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.reflection = reflection_pb2_grpc.ServerReflectionStub(self.channel)

    def metadata(self):
        return [("authorization", "Bearer " + self.token)] if self.token else []

    def call(self, method, request, timeout=30, **kwargs):
        """Calls a unary RPC with the token; returns the response."""
        return getattr(self.stub, method)(request, timeout=timeout, metadata=self.metadata(), **kwargs)

    def ctl(self, *args, timeout=120):
        """Runs memprofctl against this daemon; returns CompletedProcess."""
        cmd = [MEMPROFCTL, "--addr=" + self.addr]
        if self.token:
            cmd.append("--token_file=" + self.token_file)
        return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout)

    def metrics_text(self):
        import urllib.request
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port, timeout=10) as r:
            return r.read().decode()

    def output(self):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self, sig=signal.SIGTERM, timeout=10):
        """Sends `sig` and returns (exit code, seconds it took)."""
        if self.proc.poll() is None:
            start = time.time()
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("memprofd did not exit within %ss of signal %d:\n%s"
                                     % (timeout, sig, self.output()))
            elapsed = time.time() - start
        else:
            elapsed = 0.0
        self.channel.close()
        return self.proc.returncode, elapsed

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if hasattr(self, "channel"):  # none when it never became ready
            self.channel.close()
        self.log.close()
        self.tmp.cleanup()


def proc_status_bytes(pid, key):
    """Field `key` of /proc/PID/status (VmRSS, VmHWM, VmPeak...), in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no %s for %d" % (key, pid))


def wait_done(d, op_id, timeout=300):
    """Waits for operation `op_id` of daemon `d` to be done (WaitOperation, 10 s
    at a time) and returns it; fails the test after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        op = d.call("WaitOperation", pb.WaitOperationRequest(id=op_id, timeout_ms=10000), timeout=20)
        if op.done:
            return op
    raise AssertionError("operation %s not done in %ss" % (op_id, timeout))


class DaemonTestCase(unittest.TestCase):
    """The tests of a subclass share one daemon, `cls.d`, started in setUpClass
    with DAEMON_FLAGS (and TOKEN, when set) and closed in tearDownClass.
    `cls.scratch` is a fresh directory for the tests' own files; with
    SNAPSHOTS true the daemon also gets --snapshot_root=`cls.root`, a fresh
    directory of its own. Both go away with the class. A subclass that does
    more at class set-up calls super().setUpClass() first."""

    DAEMON_FLAGS = ()
    TOKEN = None
    SNAPSHOTS = False

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="memprofd-it-class-")
        cls.scratch = os.path.join(cls._tmp.name, "scratch")
        os.mkdir(cls.scratch)
        flags = list(cls.DAEMON_FLAGS)
        if cls.SNAPSHOTS:
            cls.root = os.path.join(cls._tmp.name, "snapshots")
            flags.append("--snapshot_root=" + cls.root)
        try:
            cls.d = Daemon(*flags, token=cls.TOKEN)
        except BaseException:
            cls._tmp.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.d.close()
        cls._tmp.cleanup()


def dashboard_queries():
    """The Grafana dashboard's PromQL expressions (read from its JSON, so that
    tests cannot drift from it), and those whose result is grouped by rank
    ("max by (rank, ...) (...)")."""
    import re
    with open(os.path.join(SOURCE_DIR, "deploy/grafana/dashboards/memprofd.json")) as f:
        dashboard = json.load(f)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return exprs, [e for e in exprs if re.match(r"\w+ by \([^)]*\brank\b", e)]


# A training request that feeds every dashboard panel: offloading, a cosine
# schedule, periodic evaluations.
DASHBOARD_TRAINING = dict(
    batch_size=2, seq_len=32, lr_scheduler_type="cosine", warmup_steps=10,
    eval_every_steps=5, eval_max_batches=1)


def dashboard_training_request(steps):
    return pb.TrainRequest(steps=steps, offload=pb.OffloadOptions(enabled=True),
                           eval_data=pb.DataSource(embedded_corpus=True), **DASHBOARD_TRAINING)


def queries_without_data(prom, exprs, by_rank, ranks=("0",), timeout=120):
    """Polls `prom` until every expression returns data (no NaN; those in
    `by_rank` a series for each of `ranks`) or `timeout` passes; returns the
    expressions that still do not."""
    missing = list(exprs)
    deadline = time.time() + timeout
    while missing and time.time() < deadline:
        time.sleep(2)
        still = []
        for expr in missing:
            code, out = prom.query(expr)
            if code != 0 or "=>" not in out or "NaN" in out or (
                    expr in by_rank and any('rank="%s"' % r not in out for r in ranks)):
                still.append(expr)
        missing = still
    return missing


class Prometheus:
    """A real Prometheus server scraping `metrics_port` (and any more ports:
    the ranks of a data-parallel run) every second, on a free port, for `with`
    blocks; `url` is its address for promtool queries."""

    def __init__(self, metrics_port, *more_ports):
        self.tmp = tempfile.TemporaryDirectory(prefix="memprofd-prom-")
        port = free_port()
        self.url = "http://127.0.0.1:%d" % port
        config = os.path.join(self.tmp.name, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: memprofd\n    static_configs:\n"
                    "      - targets: [%s]\n" % ", ".join(
                        "'127.0.0.1:%d'" % p for p in (metrics_port,) + more_ports))
        self.proc = subprocess.Popen(["prometheus", "--config.file=" + config,
                                      "--storage.tsdb.path=" + os.path.join(self.tmp.name, "data"),
                                      "--web.listen-address=127.0.0.1:%d" % port],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(self, expr):
        """promtool's instant query: (exit code, output)."""
        r = subprocess.run(["promtool", "query", "instant", self.url, expr],
                           capture_output=True, text=True)
        return r.returncode, r.stdout

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.tmp.cleanup()
