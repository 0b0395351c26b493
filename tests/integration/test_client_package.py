"""The Python client package (clients/python, import memprofd_client) against
the real daemon: every RPC through the blocking and the asyncio client (the
daemon's own per-method request counters prove each one arrived), the
exception classes with the daemon's messages, deadlines, the bearer token
from an argument, a token file or $MEMPROFD_TOKEN, TLS, the step-report
iterator across a daemon SIGKILLed and restarted from its checkpoint (no
report lost or repeated), a memory-history dump streamed to a file that
PyTorch's _memory_viz reads, both examples run as they are, pip installing
the package into a clean venv without a network, and stubs that match
proto/.

The micro model (harness.MICRO) and a few steps each keep the file at about a
minute on two busy cores."""

import asyncio
import glob
import hashlib
import inspect
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import threading
import time
import unittest
import zipfile

# One intra-op thread: the micro steps take milliseconds (test_resume.py).
if not os.environ.get("OMP_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = "1"

import grpc  # noqa: E402

import harness  # noqa: E402
from harness import Daemon, pb  # noqa: E402

import memprofd_client as mc  # noqa: E402
from memprofd_client._stubs import SERVICE  # noqa: E402

MICRO_FLAG = "--model=" + harness.micro_model_dir()
SMALL = dict(batch_size=2, seq_len=32)
PACKAGE_DIR = os.path.join(harness.SOURCE_DIR, "clients", "python")
EXAMPLES = os.path.join(PACKAGE_DIR, "examples")
RPCS = [m.name for m in SERVICE.methods]


def proto_digest(proto_dir):
    """SHA-256 over the API's .proto files (relative path, NUL, bytes, NUL, in
    path order): the rule gen_stubs.py records, computed here on its own."""
    h = hashlib.sha256()
    files = []
    for root, _, names in os.walk(os.path.join(proto_dir, "memprofd")):
        files += [os.path.join(root, n) for n in names if n.endswith(".proto")]
    for path in sorted(files, key=lambda p: os.path.relpath(p, proto_dir)):
        with open(path, "rb") as f:
            h.update(os.path.relpath(path, proto_dir).encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def rpc_counts(d):
    """{RPC name: requests the daemon counted} from its /metrics."""
    counts = {}
    for name, labels, value in harness.metric_samples(d.metrics_text()):
        if name == "memprofd_rpc_requests_total":
            counts[labels["method"]] = counts.get(labels["method"], 0) + value
    return counts


def wait_stopped(pid, timeout=30):
    """Waits until every thread of `pid` is stopped (SIGSTOP takes effect
    asynchronously: a busy thread may answer one more call first)."""
    deadline = time.monotonic() + timeout
    task_dir = "/proc/%d/task" % pid
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(task_dir):
            try:
                with open(os.path.join(task_dir, tid, "stat")) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass  # a thread that just exited
        if states and all(s in "Tt" for s in states):
            return
        time.sleep(0.01)
    raise AssertionError("memprofd (pid %d) did not stop" % pid)


def example_env():
    """The environment ctest gives, so the examples find memprofd_client as
    they would once it is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([
        os.path.join(PACKAGE_DIR, "src"), os.path.join(harness.BUILD_DIR, "clients-python")])
    return env


class StubsMatchProtoTest(unittest.TestCase):
    def test_stubs_were_generated_from_the_current_proto_files(self):
        self.assertEqual(mc.PROTO_SHA256, proto_digest(os.path.join(harness.SOURCE_DIR, "proto")),
                         "proto/ changed since memprofd_client's stubs were generated: rebuild "
                         "(cmake --build build --target memprofd_python_client) or reinstall")

    def test_every_rpc_of_the_proto_has_a_method_with_its_fields_on_both_clients(self):
        with open(os.path.join(harness.SOURCE_DIR, "proto/memprofd/v1/memprofd.proto")) as f:
            declared = re.findall(r"^\s*rpc\s+(\w+)\s*\(", f.read(), re.M)
        self.assertEqual(sorted(declared), sorted(RPCS))
        self.assertEqual(sorted(mc.RPC_METHODS), sorted(RPCS))
        for method in SERVICE.methods:
            for cls in (mc.Client, mc.AsyncClient):
                fn = getattr(cls, mc.RPC_METHODS[method.name], None)
                self.assertTrue(callable(fn), "%s lacks %s" % (cls.__name__, method.name))
                params = inspect.signature(fn).parameters
                missing = [f.name for f in method.input_type.fields if f.name not in params]
                self.assertEqual(missing, [], "%s.%s lacks %s's fields" % (
                    cls.__name__, mc.RPC_METHODS[method.name], method.input_type.name))
                self.assertIn("timeout", params)

    def test_versions_follow_the_api(self):
        self.assertEqual(mc.API_VERSION, "v1")
        self.assertEqual(mc.SERVICE_NAME, "memprofd.%s.Memprofd" % mc.API_VERSION)
        self.assertTrue(mc.__version__.startswith("1."))
        with open(os.path.join(PACKAGE_DIR, "pyproject.toml")) as f:
            self.assertIn('\nversion = "%s"\n' % mc.__version__, f.read())


class SyncClientTest(harness.DaemonTestCase):
    """The blocking client, one daemon, every RPC."""

    DAEMON_FLAGS = (MICRO_FLAG,)
    SNAPSHOTS = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.c = mc.Client(cls.d.addr, token="")

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        super().tearDownClass()

    def test_1_every_rpc_and_helper(self):
        c = self.c
        status = c.get_status()
        self.assertIsInstance(status, pb.ServerStatus)
        self.assertEqual((status.serving_state, status.data_parallel.world_size), ("SERVING", 1))
        model = c.describe_model()
        self.assertEqual(model.config.hidden_size, harness.MICRO["hidden_size"])
        # Unique storage bytes: the tied lm_head.weight is listed once, on the
        # embedding, and not counted twice.
        self.assertEqual(model.parameter_bytes, 4 * model.num_parameters)
        self.assertEqual(sum(p.bytes for p in model.parameters), model.parameter_bytes)
        embedding = [p for p in model.parameters if p.name == "model.embed_tokens.weight"]
        self.assertEqual(list(embedding[0].tied), ["lm_head.weight"])

        c.start_memory_recording(max_entries=200000)
        run = c.train(steps=4, eval_every_steps=2, eval_data=mc.embedded_corpus(),
                      eval_max_batches=1, **SMALL)
        self.assertIsInstance(run, mc.TrainOperation)
        reports = list(run.reports())
        self.assertEqual([r.step for r in reports], [1, 2, 3, 4])
        self.assertEqual([r.HasField("eval") for r in reports], [False, True, False, True])
        final = run.wait()
        self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED)
        self.assertEqual(run.result().steps_completed, 4)
        self.assertEqual([r.step for r in c.stream_step_reports(run.id, from_step=3)], [3, 4])
        self.assertTrue(list(c.watch_operation(run.id))[-1].done)
        self.assertTrue(c.wait_operation(run.id, timeout_ms=1000).done)
        self.assertEqual(c.get_operation(run.id).train.steps_completed, 4)
        self.assertIn(run.id, [op.id for op in c.operations(kind=pb.OPERATION_KIND_TRAIN)])
        self.assertEqual(len(c.list_operations(active_only=True).operations), 0)
        self.assertEqual(c.operation(run.id).result().steps_completed, 4)

        c.stop_memory_recording()
        path = os.path.join(self.scratch, "history.pickle")
        written = c.dump_memory_history(path)
        self.assertEqual(written, os.path.getsize(path))
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"".join(ch.data for ch in c.dump_memory_history()))
        r = subprocess.run([sys.executable, os.path.join(harness.SOURCE_DIR,
                                                         "tests/memory/check_memory_viz.py"),
                            path, "--torch"], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(json.loads(r.stdout)["torch_ok"])
        c.stop_memory_recording(clear=True)
        with self.assertRaises(mc.FailedPrecondition):
            c.dump_memory_history(os.path.join(self.scratch, "empty.pickle"))
        self.assertFalse(os.path.exists(os.path.join(self.scratch, "empty.pickle.part")))

        stats = c.memory()
        self.assertEqual(stats.devices[0].device, "cpu")
        self.assertGreater(stats.devices[0].peak_bytes, 0)
        c.reset_peak_memory()
        self.assertEqual(list(c.rank_memory()), [0])
        self.assertEqual(c.get_memory_stats(all_ranks=True).ranks[0].rank, 0)
        top = c.memory_top(3, phase="backward")
        self.assertEqual(len(top), 3)
        self.assertGreaterEqual(top[0].peak_bytes, top[-1].peak_bytes)
        self.assertEqual(c.memory_breakdown(by="category").by, "category")
        self.assertEqual(c.get_memory_breakdown(by="op", top=2).by, "op")
        diff = c.memory_diff(1, 4, top=5)
        self.assertEqual(list(diff.steps_kept), [1, 2, 3, 4])
        self.assertEqual(c.diff_memory(step_a=2, step_b=3).step_b, 3)
        self.assertIsNone(c.oom_report())
        with self.assertRaises(mc.NotFound):
            c.get_last_oom_report()

        ev = c.evaluate(max_batches=1, **SMALL)
        self.assertGreater(ev.wait().evaluate.loss, 0)
        self.assertEqual(ev.result().batches, 1)

        plan = c.plan_memory(train=pb.TrainRequest(**SMALL), capacity_bytes=1 << 40)
        self.assertTrue(plan.wait().plan.fits)
        self.assertGreater(plan.result().peak_allocated_bytes, plan.result().model_state_bytes)

        snap = c.snapshot("pkg-weights", dtype="SNAPSHOT_DTYPE_BF16")
        manifest = snap.wait().snapshot
        self.assertEqual((manifest.name, manifest.dtype), ("pkg-weights", "bf16"))
        self.assertEqual(c.describe_snapshot("pkg-weights").global_step, 4)
        self.assertIn("pkg-weights", [s.name for s in c.list_snapshots().snapshots])
        with self.assertRaises(mc.AlreadyExists):
            c.snapshot("pkg-weights").wait()
        c.delete_snapshot("pkg-weights")
        with self.assertRaises(mc.NotFound):
            c.describe_snapshot("pkg-weights")

        # A model directory the daemon may read: a snapshot of its own.
        kept = c.snapshot("pkg-load").wait().snapshot
        load = c.load_model(hf_directory=kept.directory, seed=3)
        self.assertEqual(load.wait().model.source, kept.directory)
        self.assertEqual(load.result().steps_trained, 0)

        long_run = c.train(steps=100000, **SMALL)
        self.assertEqual(long_run.cancel().id, long_run.id)
        final = long_run.wait(timeout=60)  # CANCELLED does not raise
        self.assertEqual(final.state, pb.OPERATION_STATE_CANCELLED)
        self.assertEqual(final.error.code, 1)

        counts = rpc_counts(self.d)
        self.assertEqual([rpc for rpc in RPCS if not counts.get(rpc)], [])

    def test_2_errors_carry_the_daemons_code_and_message(self):
        c = self.c
        with self.assertRaises(mc.InvalidArgument) as e:
            c.train(steps=0)
        self.assertEqual(e.exception.code, mc.InvalidArgument.code)
        self.assertIn("steps", e.exception.message)
        self.assertIsInstance(e.exception, ValueError)
        with self.assertRaises(mc.InvalidArgument):
            c.get_memory_breakdown(by="layer")
        with self.assertRaises(mc.NotFound) as e:
            c.get_operation("op-404")
        self.assertIn("no operation with id", e.exception.message)
        self.assertTrue(str(e.exception).startswith("NOT_FOUND: "))
        done = c.train(steps=1, **SMALL)
        done.wait()
        with self.assertRaises(mc.FailedPrecondition):
            done.cancel()
        with self.assertRaises(mc.NotFound):
            list(c.watch_operation("nope"))
        with self.assertRaises(mc.MemprofdError):
            c.delete_snapshot("../x")

    def test_3_deadlines(self):
        c = self.c
        run = c.train(steps=100000, **SMALL)
        try:
            # Client-side: the handle's own limit, a call's deadline, a stream's.
            with self.assertRaises(mc.DeadlineExceeded):
                run.wait(timeout=0.3)
            start = time.monotonic()
            with self.assertRaises(mc.DeadlineExceeded) as e:
                c.wait_operation(run.id, timeout_ms=20000, timeout=0.5)
            self.assertLess(time.monotonic() - start, 10)
            self.assertIsInstance(e.exception, TimeoutError)
            with self.assertRaises(mc.DeadlineExceeded):
                for _ in c.stream_step_reports(run.id, timeout=0.5):
                    pass
            with mc.Client(self.d.addr, token="", stream_timeout=0.5) as short:
                with self.assertRaises(mc.DeadlineExceeded):
                    list(short.watch_operation(run.id))
        finally:
            run.cancel()
            run.wait(timeout=60)
        # A daemon that hangs (SIGSTOP) on a connected channel: calls wait out
        # their deadline, the client's default or the call's own.
        with mc.Client(self.d.addr, token="", timeout=0.3) as c:
            c.get_status()
            self.d.proc.send_signal(signal.SIGSTOP)
            try:
                wait_stopped(self.d.proc.pid)
                start = time.monotonic()
                with self.assertRaises(mc.DeadlineExceeded):
                    c.get_status()
                self.assertLess(time.monotonic() - start, 1.2)
                start = time.monotonic()
                with self.assertRaises(mc.DeadlineExceeded):
                    c.get_status(timeout=1.5)
                self.assertGreaterEqual(time.monotonic() - start, 1.4)
            finally:
                self.d.proc.send_signal(signal.SIGCONT)
            self.assertEqual(c.get_status(timeout=30).serving_state, "SERVING")

    def test_4_no_daemon_is_unavailable(self):
        with mc.Client("127.0.0.1:%d" % harness.free_port(), timeout=1) as c:
            with self.assertRaises(mc.Unavailable) as e:
                c.get_status()
            self.assertIsInstance(e.exception, ConnectionError)

    def test_5_pip_installs_the_package_into_a_clean_venv_offline(self):
        tmp = tempfile.mkdtemp(prefix="memprofd-pkg-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        # A copy of clients/python beside a copy of proto/, as in a checkout,
        # so that the build leaves nothing in the source tree.
        shutil.copytree(PACKAGE_DIR, os.path.join(tmp, "src/clients/python"), ignore=shutil.ignore_patterns(
            "build", "*.egg-info", "_proto", "__pycache__"))
        shutil.copytree(os.path.join(harness.SOURCE_DIR, "proto"), os.path.join(tmp, "src/proto"))
        venv = os.path.join(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True,
                       capture_output=True, timeout=120)
        py = os.path.join(venv, "bin", "python")
        # A venv made from a venv inherits the base interpreter's site-packages,
        # not the project venv's: a .pth file adds those (grpcio, protobuf,
        # grpcio-tools, setuptools), so pip needs no index.
        here = sysconfig.get_paths()
        target = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()
        with open(os.path.join(target, "memprofd-venv.pth"), "w") as f:
            f.write("\n".join(sorted({here["purelib"], here["platlib"]})) + "\n")
        if subprocess.run([py, "-c", "import wheel"], capture_output=True).returncode != 0:
            import setuptools
            if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (70, 1):
                self.skipTest("setuptools %s builds wheels only with the wheel package, which "
                              "neither venv has" % setuptools.__version__)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL")}
        r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                            "--disable-pip-version-check", os.path.join(tmp, "src/clients/python")],
                           capture_output=True, text=True, timeout=300, env=env, cwd=tmp)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = subprocess.run([py, "-c", "import memprofd_client as m, sys; c = m.Client(sys.argv[1]); "
                            "print(m.__file__); print(m.PROTO_SHA256); "
                            "print(c.get_status().serving_state)", self.d.addr],
                           capture_output=True, text=True, timeout=60, env=env, cwd=tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        where, digest, state = r.stdout.split()
        self.assertTrue(where.startswith(venv), where)
        self.assertEqual(digest, proto_digest(os.path.join(harness.SOURCE_DIR, "proto")))
        self.assertEqual(state, "SERVING")
        self.assertFalse(os.path.exists(os.path.join(tmp, "src/clients/python/src/memprofd_client/_proto")))


def checkout_copy(tmp):
    """clients/python beside proto/ under `tmp`, as in a checkout, so that a
    build leaves nothing in the source tree; returns the package's copy."""
    package = os.path.join(tmp, "src/clients/python")
    shutil.copytree(PACKAGE_DIR, package, ignore=shutil.ignore_patterns(
        "build", "dist", "*.egg-info", "_proto", "__pycache__"))
    shutil.copytree(os.path.join(harness.SOURCE_DIR, "proto"), os.path.join(tmp, "src/proto"))
    return package


def pypi_reachable():
    """None when PyPI answers pip, else why not."""
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "tritonclient",
                        "--disable-pip-version-check"], capture_output=True, text=True, timeout=120)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["no answer"])[-1]


class PackagingTest(harness.DaemonTestCase):
    """python -m build makes an sdist carrying the generated stubs and a
    wheel; an editable install is refused saying what to do; the wheel
    installs beside tritonclient[grpc] with neither downgraded."""

    DAEMON_FLAGS = (MICRO_FLAG,)
    built = None

    @classmethod
    def build(cls):
        """(sdist, wheel) of a copy of the checkout, built once per class
        (without build isolation: offline, from the project venv's
        setuptools, wheel and grpcio-tools 1.62)."""
        if cls.built is None:
            tmp = tempfile.mkdtemp(prefix="memprofd-build-")
            cls.addClassCleanup(shutil.rmtree, tmp, ignore_errors=True)
            package = checkout_copy(tmp)
            r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "-o",
                                os.path.join(tmp, "dist"), package],
                               capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise AssertionError(r.stdout + r.stderr)
            dist = os.path.join(tmp, "dist")
            cls.built = (glob.glob(os.path.join(dist, "*.tar.gz"))[0],
                         glob.glob(os.path.join(dist, "*.whl"))[0], package)
        return cls.built

    def test_build_makes_an_sdist_with_the_stubs_and_a_wheel_that_needs_no_generator(self):
        sdist, wheel, package = self.build()
        with tarfile.open(sdist) as t:
            names = t.getnames()
        root = names[0].split("/")[0]
        self.assertIn(root + "/src/memprofd_client/_proto/memprofd/v1/train_pb2.py", names)
        self.assertIn(root + "/src/memprofd_client/_proto/memprofd/v1/train_pb2.pyi", names)
        self.assertIn(root + "/src/memprofd_client/py.typed", names)
        with zipfile.ZipFile(wheel) as z:
            wnames = z.namelist()
            meta = z.read([n for n in wnames if n.endswith("/METADATA")][0]).decode()
        self.assertIn("memprofd_client/_proto/memprofd/v1/memprofd_pb2_grpc.py", wnames)
        self.assertIn("Requires-Dist: protobuf<8,>=4.21.6", meta)
        self.assertIn("Requires-Dist: grpcio>=1.50", meta)
        self.assertFalse(os.path.exists(os.path.join(package, "src/memprofd_client/_proto")))
        # The sdist alone (no proto/ beside it, no grpcio-tools) makes the wheel.
        tmp = tempfile.mkdtemp(prefix="memprofd-sdist-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        with tarfile.open(sdist) as t:
            t.extractall(tmp)
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                            "--no-deps", "--no-index", "-w", os.path.join(tmp, "w"),
                            os.path.join(tmp, root)], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_an_editable_install_is_refused_with_what_to_do(self):
        tmp = tempfile.mkdtemp(prefix="memprofd-editable-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        package = checkout_copy(tmp)
        # A dry run (nothing is installed; the backend's editable hooks run).
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
                            "--no-build-isolation", "--disable-pip-version-check", "-e", package],
                           capture_output=True, text=True, timeout=300)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot be installed in editable mode", r.stdout + r.stderr)

    def test_the_wheel_installs_beside_tritonclient_and_neither_is_downgraded(self):
        why = pypi_reachable()
        if why is not None:
            self.skipTest("PyPI is not reachable (%s): installing beside tritonclient[grpc] "
                          "needs it" % why)
        _, wheel, _ = self.build()
        tmp = tempfile.mkdtemp(prefix="memprofd-triton-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        venv = os.path.join(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
        pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "--disable-pip-version-check"]

        def versions():
            r = subprocess.run(pip + ["list", "--format=json"], check=True, capture_output=True,
                               text=True, timeout=120)
            return {p["name"].lower(): p["version"] for p in json.loads(r.stdout)}

        r = subprocess.run(pip + ["install", "tritonclient[grpc]"], capture_output=True,
                           text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        alone = versions()
        newest = subprocess.run(pip + ["index", "versions", "tritonclient"], capture_output=True,
                                text=True, timeout=120).stdout.split("(")[1].split(")")[0]
        self.assertEqual(alone["tritonclient"], newest)
        r = subprocess.run(pip + ["install", wheel], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        beside = versions()
        for name in ("tritonclient", "grpcio", "protobuf"):
            self.assertEqual(beside[name], alone[name], "%s changed: %s -> %s" % (
                name, alone[name], beside[name]))
        self.assertEqual(beside["memprofd-client"], mc.__version__)
        r = subprocess.run(pip + ["check"], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # Both import in one process, and the client talks to the daemon.
        r = subprocess.run([os.path.join(venv, "bin", "python"), "-W", "error", "-c",
                            "import sys, tritonclient.grpc, memprofd_client as m, google.protobuf, "
                            "grpc; print(m.Client(sys.argv[1]).get_status().serving_state, "
                            "google.protobuf.__version__, grpc.__version__)", self.d.addr],
                           capture_output=True, text=True, timeout=120, cwd=tmp)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        print("\nbeside tritonclient %s: memprofd-client %s, protobuf %s, grpcio %s; %s"
              % (beside["tritonclient"], beside["memprofd-client"], beside["protobuf"],
                 beside["grpcio"], r.stdout.strip()), flush=True)
        self.assertTrue(r.stdout.startswith("SERVING"))


class AsyncClientTest(harness.DaemonTestCase):
    """The asyncio client, its own daemon, every RPC."""

    DAEMON_FLAGS = (MICRO_FLAG,)
    SNAPSHOTS = True

    def test_1_every_rpc_and_helper(self):
        asyncio.run(self.every_rpc())
        counts = rpc_counts(self.d)
        self.assertEqual([rpc for rpc in RPCS if not counts.get(rpc)], [])

    async def every_rpc(self):
        async with mc.AsyncClient(self.d.addr, token="") as c:
            status, model, stats = await asyncio.gather(c.get_status(), c.describe_model(),
                                                        c.memory())
            self.assertEqual(status.serving_state, "SERVING")
            self.assertGreater(model.num_parameters, 0)
            self.assertEqual(stats.devices[0].device, "cpu")
            await c.start_memory_recording(max_entries=100000)
            run = await c.train(steps=3, **SMALL)
            self.assertIsInstance(run, mc.AsyncTrainOperation)
            self.assertEqual([r.step async for r in run.reports()], [1, 2, 3])
            self.assertEqual((await run.wait()).state, pb.OPERATION_STATE_SUCCEEDED)
            self.assertEqual((await run.refresh()).train.steps_completed, 3)
            self.assertEqual([r.step async for r in c.stream_step_reports(run.id, from_step=2)],
                             [2, 3])
            self.assertTrue([op async for op in run.watch()][-1].done)
            self.assertTrue([op async for op in c.watch_operation(run.id)][-1].done)
            self.assertTrue((await c.wait_operation(run.id, timeout_ms=1000)).done)
            self.assertEqual((await c.get_operation(run.id)).id, run.id)
            self.assertEqual((await c.list_operations(kind="OPERATION_KIND_TRAIN")).operations[0].id,
                             run.id)
            self.assertEqual(len(await c.operations(active_only=True)), 0)
            self.assertEqual((await c.operation(run.id)).result().steps_completed, 3)

            await c.stop_memory_recording()
            path = os.path.join(self.scratch, "async.pickle")
            self.assertGreater(await c.dump_memory_history(path), 0)
            with open(path, "rb") as f:
                self.assertEqual(f.read(), b"".join([ch.data async for ch in c.dump_memory_history()]))
            await c.reset_peak_memory()
            self.assertEqual(list(await c.rank_memory()), [0])
            self.assertEqual((await c.get_memory_stats(all_ranks=True)).ranks[0].rank, 0)
            self.assertEqual(len(await c.memory_top(2)), 2)
            self.assertEqual((await c.memory_breakdown(by="op")).by, "op")
            self.assertEqual((await c.get_memory_breakdown(by="category")).by, "category")
            self.assertEqual(list((await c.memory_diff(1, 3)).steps_kept), [1, 2, 3])
            self.assertEqual((await c.diff_memory(step_a=1, step_b=2)).step_a, 1)
            self.assertIsNone(await c.oom_report())
            with self.assertRaises(mc.NotFound):
                await c.get_last_oom_report()

            ev = await c.evaluate(max_batches=1, **SMALL)
            self.assertGreater((await ev.wait()).evaluate.loss, 0)
            plan = await c.plan_memory(train=pb.TrainRequest(**SMALL))
            self.assertGreater((await plan.wait()).plan.peak_allocated_bytes, 0)
            snap = await c.snapshot("async-weights")
            self.assertEqual((await snap.wait()).snapshot.global_step, 3)
            self.assertEqual((await c.describe_snapshot("async-weights")).name, "async-weights")
            self.assertEqual([s.name for s in (await c.list_snapshots()).snapshots],
                             ["async-weights"])
            await c.delete_snapshot("async-weights")
            kept = (await (await c.snapshot("async-load")).wait()).snapshot
            load = await c.load_model(hf_directory=kept.directory)
            self.assertEqual((await load.wait()).model.steps_trained, 0)

            long_run = await c.train(steps=100000, **SMALL)
            with self.assertRaises(mc.DeadlineExceeded):
                await long_run.wait(timeout=0.3)
            with self.assertRaises(mc.DeadlineExceeded):
                await c.wait_operation(long_run.id, timeout_ms=20000, timeout=0.5)
            await long_run.cancel()
            self.assertEqual((await long_run.wait(timeout=60)).state, pb.OPERATION_STATE_CANCELLED)
            with self.assertRaises(mc.FailedPrecondition):
                await long_run.cancel()
            with self.assertRaises(mc.InvalidArgument):
                await c.train(steps=0)
            with self.assertRaises(mc.NotFound):
                await c.get_operation("op-404")
            with self.assertRaises(mc.NotFound):
                async for _ in c.watch_operation("op-404"):
                    pass
        async with mc.AsyncClient("127.0.0.1:%d" % harness.free_port(), timeout=5) as gone:
            with self.assertRaises(mc.Unavailable):
                await gone.get_status()


class AuthTest(harness.DaemonTestCase):
    """Tokens as the daemon and memprofctl take them."""

    TOKEN = "pkg-s3cret"

    def test_missing_or_wrong_token_is_unauthenticated(self):
        for token in ("", "pkg-s3cre", "pkg-s3cret-and-more"):
            with mc.Client(self.d.addr, token=token) as c:
                with self.assertRaises(mc.Unauthenticated) as e:
                    c.get_status()
                self.assertIn("authorization", e.exception.message)
                with self.assertRaises(mc.Unauthenticated):
                    list(c.watch_operation("op-1"))

        async def wrong():
            async with mc.AsyncClient(self.d.addr, token="wrong") as c:
                await c.get_status()
        with self.assertRaises(mc.Unauthenticated):
            asyncio.run(wrong())

    def test_token_from_argument_file_and_environment(self):
        with mc.Client(self.d.addr, token=self.TOKEN) as c:
            self.assertEqual(c.get_status().serving_state, "SERVING")
        with mc.Client(self.d.addr, token_file=self.d.token_file) as c:  # memprofctl's --token_file
            self.assertEqual(c.get_status().serving_state, "SERVING")
        old = os.environ.get(mc.TOKEN_ENV)
        os.environ[mc.TOKEN_ENV] = self.TOKEN
        try:
            with mc.Client(self.d.addr) as c:
                self.assertEqual(c.get_status().serving_state, "SERVING")
        finally:
            if old is None:
                del os.environ[mc.TOKEN_ENV]
            else:
                os.environ[mc.TOKEN_ENV] = old

    def test_token_file_others_may_read_is_refused_as_the_daemon_refuses_it(self):
        path = os.path.join(self.scratch, "token")
        with open(path, "w") as f:
            f.write(self.TOKEN + "\n# comment\n")
        for mode, ok in ((0o600, True), (0o400, True), (0o640, True), (0o644, False),
                         (0o660, False), (0o602, False)):
            os.chmod(path, mode)
            if ok:
                self.assertEqual(mc.read_token_file(path), self.TOKEN)
                continue
            with self.assertRaises(mc.FailedPrecondition) as e:
                mc.Client(self.d.addr, token_file=path)
            self.assertIn("chmod 600", e.exception.message)
            r = subprocess.run([harness.MEMPROFD, "--listen=127.0.0.1:0",
                                "--metrics_listen=127.0.0.1:0", "--auth_token_file=" + path],
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0, "memprofd accepted mode %o" % mode)
            self.assertIn("chmod 600", r.stderr)
        os.chmod(path, 0o600)
        with open(path, "w") as f:
            f.write("\n")
        with self.assertRaises(mc.FailedPrecondition):
            mc.read_token_file(path)

    @unittest.skipUnless(shutil.which("openssl"), "openssl not installed")
    def test_tls_with_a_ca_file(self):
        cert, key = os.path.join(self.scratch, "cert.pem"), os.path.join(self.scratch, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                        "-keyout", key, "-out", cert], check=True, capture_output=True)
        d = Daemon(MICRO_FLAG, "--tls_cert=" + cert, "--tls_key=" + key, token="tls-s3cret")
        try:
            addr = "localhost:%d" % d.grpc_port
            with mc.Client(addr, tls_ca=cert, token="tls-s3cret") as c:
                self.assertEqual(c.get_status().serving_state, "SERVING")
            with mc.Client(addr, tls_ca=cert, token="") as c:
                with self.assertRaises(mc.Unauthenticated):
                    c.get_status()
            with mc.Client(addr, token="tls-s3cret", timeout=1) as c:  # loopback: plaintext
                with self.assertRaises(mc.Unavailable):
                    c.get_status()
        finally:
            d.close()

    @unittest.skipUnless(shutil.which("openssl"), "openssl not installed")
    def test_tls_against_a_plaintext_daemon_says_to_pass_insecure(self):
        d = Daemon(MICRO_FLAG)
        try:
            # TLS asked for (as for any address that is not loopback) where
            # the daemon serves plaintext.
            with mc.Client(d.addr, token="", insecure=False, timeout=2) as c:
                with self.assertRaises(mc.Unavailable) as e:
                    c.get_status()
            self.assertIn("insecure=True", e.exception.message)
        finally:
            d.close()


class ReportsAcrossRestartTest(unittest.TestCase):
    """reports() across a daemon SIGKILLed mid-run and restarted on the same
    address from its last checkpoint, where Train(resume=True) goes on: every
    global step exactly once, in order."""

    def run_case(self, use_async):
        root = tempfile.mkdtemp(prefix="memprofd-pkg-resume-")
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        port = harness.free_port()
        flags = ("--listen=127.0.0.1:%d" % port, "--snapshot_root=" + root,
                 "--snapshot_every_steps=10")
        daemons = [Daemon(MICRO_FLAG, *flags)]
        self.addCleanup(lambda: [d.close() for d in daemons])

        def restart():
            # SIGKILL on the report of global step 11: the daemon may run a
            # few steps on, not the nine to the step-20 checkpoint; it
            # resumes from step 10 and repeats reports the client has seen.
            daemons[0].proc.kill()
            daemons[0].proc.wait()
            daemons.append(Daemon("--model=", "--resume=latest", *flags))
            self.assertEqual(daemons[1].call("GetStatus", pb.GetStatusRequest()).model.steps_trained,
                             10, daemons[1].output())
            daemons[1].call("Train", pb.TrainRequest(resume=True))

        addr = "127.0.0.1:%d" % port
        if use_async:
            async def body():
                async with mc.AsyncClient(addr, token="", reconnect_timeout=60) as c:
                    run = await c.train(steps=30, seed=7, **SMALL)
                    seen = []
                    async for r in run.reports():
                        seen.append(r.global_step)
                        if r.global_step == 11 and len(daemons) == 1:
                            restart()
                    return seen, run, await run.wait()
            seen, run, final = asyncio.run(body())
        else:
            with mc.Client(addr, token="", reconnect_timeout=60) as c:
                run = c.train(steps=30, seed=7, **SMALL)
                seen = []
                for r in run.reports():
                    seen.append(r.global_step)
                    if r.global_step == 11 and len(daemons) == 1:
                        restart()
                final = run.wait()
        self.assertEqual(len(daemons), 2)
        self.assertIn("resumed from checkpoint", daemons[1].output())
        self.assertEqual(seen, list(range(1, 31)))
        self.assertEqual(run.lost_global_steps, [])
        self.assertEqual(len(run.followed), 2, run.followed)
        self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED)
        self.assertEqual(final.train.steps_completed, 20)

    def test_sync(self):
        self.run_case(use_async=False)

    def test_async(self):
        self.run_case(use_async=True)


class DrainRestartTest(unittest.TestCase):
    """A training on a daemon that gets SIGTERM (as Kubernetes and systemd
    stop it) and is restarted with --resume=latest, where an orchestrator
    calls Train(resume=True): the drained operation ends ABORTED with reason
    DRAINING naming the shutdown checkpoint (not CANCELLED), and the
    client's reports() and wait() follow the resumed run at once, every
    global step exactly once, without waiting out reconnect_timeout (left at
    its default, 120 s)."""

    STEPS = 40
    SIGTERM_AT = 12
    # How many restarts each case goes through (MEMPROFD_DRAIN_RESTART_TRIES
    # to measure how often a follow is slow; 1 in make test).
    TRIES = int(os.environ.get("MEMPROFD_DRAIN_RESTART_TRIES", "1"))

    def run_case(self, use_async):
        root = tempfile.mkdtemp(prefix="memprofd-pkg-drain-")
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        port = harness.free_port()
        flags = ("--listen=127.0.0.1:%d" % port, "--snapshot_root=" + root,
                 "--snapshot_on_shutdown")
        daemons = [Daemon(MICRO_FLAG, *flags)]
        self.addCleanup(lambda: [d.close() for d in daemons])
        times = {}

        def restart():
            # The orchestrator's side: the old daemon drains and exits 0, a
            # new one starts from the latest checkpoint, and the run goes on.
            old = daemons[0]
            times["sigterm"] = time.monotonic()
            old.proc.send_signal(signal.SIGTERM)
            code = old.proc.wait(timeout=60)
            times["exited"] = time.monotonic()
            self.assertEqual(code, 0, old.output())
            daemons.append(Daemon("--model=", "--resume=latest", *flags))
            times["serving"] = time.monotonic()
            daemons[1].call("Train", pb.TrainRequest(resume=True))
            times["resumed"] = time.monotonic()

        restarter = threading.Thread(target=restart)
        addr = "127.0.0.1:%d" % port
        seen = []

        def on_report(r, followed):
            if len(followed) > 1 and "first_resumed" not in times:
                times["first_resumed"] = time.monotonic()
            seen.append(r.global_step)
            if r.global_step == self.SIGTERM_AT and len(daemons) == 1:
                restarter.start()

        if use_async:
            async def body():
                async with mc.AsyncClient(addr, token="") as c:
                    run = await c.train(steps=self.STEPS, seed=7, **SMALL)
                    async for r in run.reports():
                        on_report(r, run.followed)
                    return run, await run.wait()
            run, final = asyncio.run(body())
        else:
            with mc.Client(addr, token="") as c:
                run = c.train(steps=self.STEPS, seed=7, **SMALL)
                for r in run.reports():
                    on_report(r, run.followed)
                final = run.wait()
        times["done"] = time.monotonic()
        restarter.join()
        self.assertEqual(len(daemons), 2)
        out = daemons[0].output()
        self.assertIn("snapshot 'shutdown-", out)
        self.assertEqual(seen, list(range(1, self.STEPS + 1)))  # each exactly once
        self.assertEqual(run.lost_global_steps, [])
        self.assertEqual(len(run.followed), 2, run.followed)
        self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED)
        # The resumed run did the rest: its checkpoint held the step the
        # drain stopped at, so no step ran twice.
        stopped = self.STEPS - final.train.steps_completed
        self.assertGreaterEqual(stopped, self.SIGTERM_AT)
        self.assertRegex(daemons[1].output(), r"resumed from checkpoint \S*/shutdown-\d+ at step %d"
                         % stopped)
        follow = times["first_resumed"] - times["resumed"]
        print("\n%s: SIGTERM at global step %d, the drain stopped the run at %d; daemon exited "
              "%.2f s after SIGTERM, served again %.2f s later; first report of the resumed run "
              "%.2f s after its Train; reports %d..%d each once, none lost"
              % ("async" if use_async else "sync", self.SIGTERM_AT, stopped,
                 times["exited"] - times["sigterm"], times["serving"] - times["exited"],
                 follow, seen[0], seen[-1]), flush=True)
        self.assertLess(follow, 10.0)  # reconnect_timeout is 120 s

    def test_sync(self):
        for _ in range(self.TRIES):
            self.run_case(use_async=False)

    def test_async(self):
        for _ in range(self.TRIES):
            self.run_case(use_async=True)

    def test_the_drained_operation_is_aborted_with_its_reason_and_checkpoint(self):
        root = tempfile.mkdtemp(prefix="memprofd-pkg-drain-")
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        d = Daemon(MICRO_FLAG, "--snapshot_root=" + root, "--snapshot_on_shutdown")
        self.addCleanup(d.close)
        watcher = mc.Client(d.addr, token="", reconnect_timeout=1)
        self.addCleanup(watcher.close)
        run = watcher.train(steps=100000, **SMALL)
        for r in run.reports():
            if r.step == 3:
                break
        ops = []

        def watch():  # the handle sees the operation end
            for op in run.watch():
                ops.append(op)
        w = threading.Thread(target=watch)
        w.start()
        code, _ = d.stop(signal.SIGTERM, timeout=60)
        w.join(timeout=30)
        self.assertEqual(code, 0, d.output())
        last = ops[-1]
        self.assertTrue(last.done)
        self.assertEqual(last.state, pb.OPERATION_STATE_FAILED)
        self.assertEqual(last.error.code, grpc.StatusCode.ABORTED.value[0])
        self.assertIn("memprofd is shutting down: the training stopped after", last.error.message)
        self.assertEqual(last.error.reason, mc.DRAINING)
        self.assertTrue(last.train.resume_checkpoint.startswith("shutdown-"), last)
        self.assertEqual(last.train.resume_global_step, last.train.global_step)
        self.assertIn("checkpoint '%s' holds global step %d" % (
            last.train.resume_checkpoint, last.train.global_step), last.error.message)
        # Nobody resumes it: wait() raises the drain's own error, after the
        # client's reconnect_timeout (1 s here).
        with self.assertRaises(mc.Aborted) as e:
            run.wait()
        self.assertIn("no training resumed it", e.exception.message)

    def test_while_draining_status_says_so_and_new_operations_are_unavailable(self):
        # The tiny preset's shutdown checkpoint takes a moment to write, so
        # that calls land while it is written.
        root = tempfile.mkdtemp(prefix="memprofd-pkg-drain-")
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        d = Daemon("--model=tiny", "--snapshot_root=" + root, "--snapshot_on_shutdown")
        self.addCleanup(d.close)
        c = mc.Client(d.addr, token="", timeout=5, wait_for_ready=False)
        self.addCleanup(c.close)
        run = c.train(steps=100000, batch_size=1, seq_len=16)
        while c.get_operation(run.id).progress.completed < 1:
            time.sleep(0.05)
        answers = []
        d.proc.send_signal(signal.SIGTERM)
        for i in itertools.count():
            try:
                answers.append(c.get_status().serving_state)
                answers.append("accepted" if c.snapshot("probe-%d" % i) else "")
            except mc.Unavailable as e:
                if "memprofd is shutting down" not in e.message:
                    break  # the daemon is gone, or cancelled the call as it went
                answers.append("UNAVAILABLE")
            except mc.MemprofdError as e:
                answers.append(e.code.name)
        d.proc.wait(timeout=60)
        first = next(i for i, a in enumerate(answers) if a in ("DRAINING", "UNAVAILABLE"))
        self.assertEqual(set(answers[first:]), {"DRAINING", "UNAVAILABLE"}, answers)
        self.assertIn("DRAINING", answers, answers)


class ExamplesTest(harness.DaemonTestCase):
    """clients/python/examples and the README's snippets run as they are,
    against this daemon."""

    DAEMON_FLAGS = (MICRO_FLAG,)
    SNAPSHOTS = True

    def example(self, name, *args, timeout=120):
        return subprocess.run([sys.executable, os.path.join(EXAMPLES, name), self.d.addr] + list(args),
                              capture_output=True, text=True, timeout=timeout, env=example_env())

    def test_orchestrator_stops_when_the_evaluation_loss_stops_improving(self):
        # A gain of 100 nats is never reached: the second and third
        # evaluations (steps 4 and 6) do not improve, and it cancels.
        r = self.example("orchestrator.py", "--steps=200", "--batch-size=2", "--seq-len=32",
                         "--snapshot-every=2", "--snapshot-prefix=early", "--eval-every=2",
                         "--eval-max-batches=1", "--patience=2", "--min-delta=100", "--log-every=1")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("stopping: evaluation loss stopped improving", r.stdout)
        self.assertIn("CANCELLED", r.stdout)
        # Checkpoints after the run's steps 2, 4 and 6 (named by global step).
        early = [s for s in self.d.client.list_snapshots().snapshots
                 if s.name.startswith("early-step-")]
        self.assertEqual(len(early), 3, r.stdout)
        self.assertEqual({s.kind for s in early}, {pb.SNAPSHOT_KIND_CHECKPOINT})
        ops = self.d.client.operations(kind=pb.OPERATION_KIND_TRAIN)
        self.assertEqual(ops[0].state, pb.OPERATION_STATE_CANCELLED)
        self.assertLess(ops[0].train.steps_completed, 200)

    def test_orchestrator_checkpoints_and_stops_on_sigterm(self):
        p = subprocess.Popen([sys.executable, os.path.join(EXAMPLES, "orchestrator.py"), self.d.addr,
                              "--steps=100000", "--batch-size=2", "--seq-len=32",
                              "--snapshot-every=0", "--snapshot-prefix=term", "--eval-every=0",
                              "--log-every=5"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=example_env())
        try:
            for line in p.stdout:
                if line.startswith("step "):
                    break
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 0, out + err)
        self.assertIn("stopping: SIGTERM", out)
        self.assertIn("CANCELLED", out)
        sigterm = [s for s in self.d.client.list_snapshots().snapshots
                   if s.name.startswith("term-sigterm-step-")]
        self.assertEqual(len(sigterm), 1, out)
        self.assertEqual(sigterm[0].kind, pb.SNAPSHOT_KIND_CHECKPOINT)

    def test_readme_snippets_run_as_they_are(self):
        # Every ```python block of the package's README, against this daemon.
        with open(os.path.join(PACKAGE_DIR, "README.md")) as f:
            snippets = re.findall(r"```python\n(.*?)```", f.read(), re.S)
        self.assertGreaterEqual(len(snippets), 2)
        env = example_env()
        env.pop(mc.TOKEN_ENV, None)
        for i, code in enumerate(snippets):
            self.assertIn("127.0.0.1:50051", code)
            with tempfile.TemporaryDirectory() as cwd:
                r = subprocess.run([sys.executable, "-c", code.replace("127.0.0.1:50051", self.d.addr)],
                                   capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
            self.assertEqual(r.returncode, 0, "README snippet %d:\n%s\n%s" % (i, code,
                                                                          r.stdout + r.stderr))

    def test_preflight_accepts_a_fitting_budget_and_refuses_a_small_one(self):
        model = self.d.client.describe_model()
        r = self.example("preflight.py", "--budget=1GB")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("fits", r.stdout)
        r = self.example("preflight.py", "--budget=%d" % (model.parameter_bytes * 2))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("refused", r.stdout)
        r = self.example("preflight.py", "--budget=lots")
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main()
