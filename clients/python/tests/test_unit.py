"""memprofd_client's own logic without a daemon, in seconds: an in-process
gRPC server (the generated servicer, scripted per test) stands in for the
transport. What the daemon does is tested against the real binary in
tests/integration/test_client_package.py; here only what the package
decides: request building and enum names, errors (every one a
MemprofdError), the retry policy and wait_for_ready, the TLS hint, a closed
client, a module-level AsyncClient, and following a training across a
drain (the operation ends ABORTED, reason DRAINING) into the run that
resumes it, or not following a user's cancel.

Run with the package and its generated stubs on PYTHONPATH (ctest
client_python_unit does).
"""

import asyncio
import inspect
import socket
import threading
import time
import unittest
from concurrent import futures

import grpc

import memprofd_client as mc
from memprofd_client import pb
from memprofd_client._stubs import memprofd_pb2_grpc


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fake(memprofd_pb2_grpc.MemprofdServicer):
    """A scripted daemon: counts every call by RPC; each test sets what the
    RPCs it uses answer."""

    def __init__(self):
        self.calls = {}
        self.lock = threading.Lock()
        self.status_failures = 0  # GetStatus answers UNAVAILABLE this many times first
        self.ops = {}  # id -> Operation, as GetOperation answers
        self.reports = {}  # id -> [StepReport]
        self.listed = []  # ListOperations' operations

    def count(self, rpc):
        with self.lock:
            self.calls[rpc] = self.calls.get(rpc, 0) + 1
            return self.calls[rpc]

    def GetStatus(self, request, context):
        if self.count("GetStatus") <= self.status_failures:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        return pb.ServerStatus(serving_state="SERVING")

    def Train(self, request, context):
        self.count("Train")
        if request.steps == 13:
            context.abort(grpc.StatusCode.UNAVAILABLE, "memprofd is shutting down")
        return self.ops["op-1"]

    def Snapshot(self, request, context):
        self.count("Snapshot")
        return pb.Operation(id="op-9", kind=pb.OPERATION_KIND_SNAPSHOT, done=True,
                            state=pb.OPERATION_STATE_SUCCEEDED,
                            snapshot=pb.SnapshotManifest(name=request.name))

    def GetOperation(self, request, context):
        self.count("GetOperation")
        if request.id not in self.ops:
            context.abort(grpc.StatusCode.NOT_FOUND, "no operation with id " + request.id)
        return self.ops[request.id]

    def WaitOperation(self, request, context):
        return self.GetOperation(pb.GetOperationRequest(id=request.id), context)

    def ListOperations(self, request, context):
        self.count("ListOperations")
        return pb.ListOperationsResponse(operations=list(self.listed))

    def StreamStepReports(self, request, context):
        self.count("StreamStepReports")
        for r in self.reports.get(request.operation_id, []):
            if r.step >= request.from_step:
                yield r


def op(id, state=pb.OPERATION_STATE_RUNNING, created=1, reason="", code=0, message="",
       steps=0):
    o = pb.Operation(id=id, kind=pb.OPERATION_KIND_TRAIN, state=state, create_time_us=created,
                     done=state in (pb.OPERATION_STATE_SUCCEEDED, pb.OPERATION_STATE_FAILED,
                                    pb.OPERATION_STATE_CANCELLED))
    if code:
        o.error.code, o.error.message, o.error.reason = code, message, reason
    if o.done:
        o.train.steps_completed = steps
    return o


def reports(first_global, n):
    return [pb.StepReport(step=i + 1, global_step=first_global + i, loss=1.0) for i in range(n)]


class ServerCase(unittest.TestCase):
    """A Fake served on a free port for each test; `self.addr`."""

    def setUp(self):
        self.fake = Fake()
        self.server = grpc.server(futures.ThreadPoolExecutor(8))
        memprofd_pb2_grpc.add_MemprofdServicer_to_server(self.fake, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.addr = "127.0.0.1:%d" % self.port
        self.addCleanup(self.server.stop, 0)

    def drained_then_resumed(self):
        """op-1 ran global steps 1..3 and was stopped by a drain; op-2 (the
        Train with resume on the restarted daemon) runs 4..6 and succeeds."""
        drained = op("op-1", pb.OPERATION_STATE_FAILED, created=10, reason=mc.DRAINING, code=10,
                     message="memprofd is shutting down: the training stopped after 3 of 6 "
                             "steps, at global step 3; checkpoint 'shutdown-1' holds global "
                             "step 3", steps=3)
        self.fake.ops["op-1"] = drained
        self.fake.reports["op-1"] = reports(1, 3)
        resumed = op("op-2", pb.OPERATION_STATE_SUCCEEDED, created=20, steps=3)
        self.fake.ops["op-2"] = resumed
        self.fake.reports["op-2"] = reports(4, 3)
        self.fake.listed = [resumed, drained]


class RequestsAndErrorsTest(unittest.TestCase):
    def test_enum_names_numbers_and_short_names(self):
        r = mc._methods.request(pb.SnapshotRequest, name="a", kind="SNAPSHOT_KIND_CHECKPOINT")
        self.assertEqual(r.kind, pb.SNAPSHOT_KIND_CHECKPOINT)
        r = mc._methods.request(pb.SnapshotRequest, name="a", kind="CHECKPOINT", dtype=2)
        self.assertEqual((r.kind, r.dtype), (pb.SNAPSHOT_KIND_CHECKPOINT, 2))
        self.assertEqual(mc._methods.request(pb.SnapshotRequest, name="a", dtype=None).dtype, 0)

    def test_an_unknown_enum_name_lists_the_valid_ones(self):
        with self.assertRaises(mc.InvalidArgument) as e:
            mc._methods.request(pb.SnapshotRequest, name="a", kind="CHECKPIONT")
        self.assertIsInstance(e.exception, ValueError)
        self.assertIn("SNAPSHOT_KIND_CHECKPOINT", e.exception.message)
        self.assertIn("SNAPSHOT_KIND_WEIGHTS", e.exception.message)
        self.assertIn("'CHECKPIONT' for kind", e.exception.message)

    def test_a_value_of_the_wrong_type_is_invalid_argument_and_type_error(self):
        with self.assertRaises(mc.InvalidArgument) as e:
            mc._methods.request(pb.TrainRequest, steps="ten")
        self.assertIsInstance(e.exception, TypeError)
        self.assertIn("TrainRequest", e.exception.message)
        with self.assertRaises(TypeError):
            mc._methods.request(pb.SnapshotRequest, name="a", kind=1.5)

    def test_local_checks_raise_memprofd_errors(self):
        with self.assertRaises(mc.InvalidArgument):
            mc.Client("10.0.0.1:1", tls_ca="/x", insecure=True)
        with self.assertRaises(mc.FailedPrecondition) as e:
            mc.Client("10.0.0.1:1", tls_ca="/nonexistent/ca.pem")
        self.assertIn("tls_ca", e.exception.message)

    def test_every_exception_class_is_a_memprofd_error_with_its_builtin(self):
        for name in mc.errors.__all__[:-1]:
            self.assertTrue(issubclass(getattr(mc, name), mc.MemprofdError), name)
        for cls, builtin in ((mc.InvalidArgument, ValueError), (mc.NotFound, LookupError),
                             (mc.DeadlineExceeded, TimeoutError),
                             (mc.Unavailable, ConnectionError)):
            self.assertTrue(issubclass(cls, builtin))
        e = mc.errors.also(mc.FailedPrecondition, OSError, "cannot write")
        self.assertIsInstance(e, mc.FailedPrecondition)
        self.assertIsInstance(e, OSError)
        self.assertIs(type(e), type(mc.errors.also(mc.FailedPrecondition, OSError, "again")))
        self.assertEqual(str(e), "FAILED_PRECONDITION: cannot write")

    def test_every_public_method_has_a_docstring_and_both_clients_the_same_signatures(self):
        classes = (mc.Client, mc.AsyncClient, mc.OperationHandle, mc.TrainOperation,
                   mc.AsyncOperationHandle, mc.AsyncTrainOperation)
        missing = []
        for cls in classes:
            for name, member in inspect.getmembers(cls):
                if name.startswith("_"):
                    continue
                if (inspect.isfunction(member) or isinstance(member, property)) and \
                        not inspect.getdoc(member):
                    missing.append("%s.%s" % (cls.__name__, name))
        self.assertEqual(missing, [])
        for name, method in inspect.getmembers(mc.Client, inspect.isfunction):
            if name.startswith("_") or name in ("close",):
                continue
            other = getattr(mc.AsyncClient, name)
            a, b = inspect.signature(method), inspect.signature(other)
            self.assertEqual(list(a.parameters), list(b.parameters), name)
            self.assertEqual([p.default for p in a.parameters.values()],
                             [p.default for p in b.parameters.values()], name)


    def test_the_request_methods_take_every_field_of_their_request(self):
        # A field the proto gains reaches the package's callers only when the
        # method that builds its request takes it.
        for method, message in ((mc.Client.train, pb.TrainRequest),
                                (mc.Client.evaluate, pb.EvaluateRequest),
                                (mc.Client.load_model, pb.LoadModelRequest)):
            taken = set(inspect.signature(method).parameters) - {"self", "timeout"}
            fields = {f.name for f in message.DESCRIPTOR.fields}
            self.assertEqual(fields - taken, set(), method.__name__)


class ConnectionTest(ServerCase):
    def test_idempotent_calls_are_retried_and_others_are_not(self):
        self.fake.status_failures = 2
        with mc.Client(self.addr, token="") as c:
            self.assertEqual(c.get_status().serving_state, "SERVING")
            self.assertEqual(self.fake.calls["GetStatus"], 3)
            with self.assertRaises(mc.Unavailable):
                c.train(steps=13)
            self.assertEqual(self.fake.calls["Train"], 1)

    def test_wait_for_ready_waits_for_a_daemon_that_starts_later(self):
        port = free_port()
        server = grpc.server(futures.ThreadPoolExecutor(2))
        memprofd_pb2_grpc.add_MemprofdServicer_to_server(Fake(), server)

        def start_later():
            time.sleep(0.7)
            server.add_insecure_port("127.0.0.1:%d" % port)
            server.start()
        starter = threading.Thread(target=start_later)
        with mc.Client("127.0.0.1:%d" % port, token="", timeout=10) as c:
            started = time.monotonic()
            starter.start()
            self.assertEqual(c.get_status().serving_state, "SERVING")
            waited = time.monotonic() - started
        starter.join()
        server.stop(0)
        self.assertGreater(waited, 0.6)
        self.assertLess(waited, 3.0)

    def test_a_new_client_after_a_restart_connects_as_soon_as_the_daemon_serves(self):
        # A client that saw the daemon go away leaves its connection backing
        # off; a new client has a connection of its own, so it is not held
        # by that backoff.
        old = mc.Client(self.addr, token="", timeout=1, wait_for_ready=False)
        old.get_status()
        self.server.stop(0).wait()
        for _ in range(3):
            with self.assertRaises(mc.Unavailable):
                old.get_status()
        server = grpc.server(futures.ThreadPoolExecutor(2))
        memprofd_pb2_grpc.add_MemprofdServicer_to_server(Fake(), server)
        server.add_insecure_port(self.addr)
        server.start()
        try:
            started = time.monotonic()
            with mc.Client(self.addr, token="", timeout=10) as new:
                self.assertEqual(new.get_status().serving_state, "SERVING")
            self.assertLess(time.monotonic() - started, 1.0)
        finally:
            old.close()
            server.stop(0)

    def test_no_daemon_is_unavailable_after_the_deadline_or_at_once_without_waiting(self):
        addr = "127.0.0.1:%d" % free_port()
        with mc.Client(addr, token="", timeout=0.5) as c:
            with self.assertRaises(mc.Unavailable) as e:
                c.get_status()
            self.assertIn("could not be reached", e.exception.message)
        with mc.Client(addr, token="", timeout=5, wait_for_ready=False) as c:
            started = time.monotonic()
            with self.assertRaises(mc.Unavailable):
                c.get_status()
            self.assertLess(time.monotonic() - started, 2.0)

    def test_tls_against_a_plaintext_daemon_says_to_pass_insecure(self):
        with mc.Client(self.addr, token="", insecure=False, timeout=2) as c:
            with self.assertRaises(mc.Unavailable) as e:
                c.get_status()
        self.assertIn("insecure=True", e.exception.message)
        with mc.Client(self.addr, token="", insecure=False, timeout=5,
                       wait_for_ready=False) as c:
            with self.assertRaises(mc.Unavailable) as e:
                c.get_status()
        self.assertIn("insecure=True", e.exception.message)

    def test_a_closed_client_raises_failed_precondition_also_a_value_error(self):
        c = mc.Client(self.addr, token="")
        c.get_status()
        c.close()
        with self.assertRaises(mc.FailedPrecondition) as e:
            c.get_status()
        self.assertIsInstance(e.exception, ValueError)
        self.assertIn("closed", e.exception.message)

        async def closed():
            a = mc.AsyncClient(self.addr, token="")
            await a.get_status()
            await a.close()
            await a.get_status()
        with self.assertRaises(mc.FailedPrecondition):
            asyncio.run(closed())


# Made at import, outside any event loop, as a module-level client is.
MODULE_CLIENT = mc.AsyncClient("127.0.0.1:1", token="")


class AsyncClientTest(ServerCase):
    def test_a_module_level_client_works_in_each_event_loop(self):
        client = mc.AsyncClient(self.addr, token="")  # no loop runs here
        for _ in range(2):  # two loops, one after the other
            status = asyncio.run(client.get_status())
            self.assertEqual(status.serving_state, "SERVING")
        MODULE_CLIENT.addr = self.addr
        MODULE_CLIENT._channel = None
        self.assertEqual(asyncio.run(MODULE_CLIENT.get_status()).serving_state, "SERVING")

        async def gathered():
            return await asyncio.gather(client.get_status(), client.get_status())
        self.assertEqual(len(asyncio.run(gathered())), 2)
        asyncio.run(client.close())


class FollowDrainTest(ServerCase):
    """A training the daemon stopped to shut down is followed into the run
    that resumes it: every global step once, no wait for a timeout."""

    def test_reports_and_wait_follow_a_drained_run(self):
        self.drained_then_resumed()
        with mc.Client(self.addr, token="", reconnect_timeout=30) as c:
            run = c.train(steps=6)
            started = time.monotonic()
            seen = [r.global_step for r in run.reports()]
            final = run.wait()
            elapsed = time.monotonic() - started
        self.assertEqual(seen, [1, 2, 3, 4, 5, 6])
        self.assertEqual(run.followed, ["op-1", "op-2"])
        self.assertEqual(run.lost_global_steps, [])
        self.assertEqual(final.id, "op-2")
        self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED)
        self.assertLess(elapsed, 5.0)

    def test_wait_alone_follows_and_async_reports_too(self):
        self.drained_then_resumed()
        with mc.Client(self.addr, token="", reconnect_timeout=30) as c:
            self.assertEqual(c.train(steps=6).wait().id, "op-2")

        async def body():
            async with mc.AsyncClient(self.addr, token="", reconnect_timeout=30) as a:
                run = await a.train(steps=6)
                seen = [r.global_step async for r in run.reports()]
                return seen, run.followed, (await run.wait()).id
        self.assertEqual(asyncio.run(body()), ([1, 2, 3, 4, 5, 6], ["op-1", "op-2"], "op-2"))

    def test_a_drained_run_nobody_resumes_raises_aborted_naming_the_checkpoint(self):
        self.drained_then_resumed()
        self.fake.listed = [self.fake.ops["op-1"]]
        with mc.Client(self.addr, token="", reconnect_timeout=0.6) as c:
            run = c.train(steps=6)
            with self.assertRaises(mc.Aborted) as e:
                run.wait()
        self.assertIn("checkpoint 'shutdown-1'", e.exception.message)
        self.assertIn("no training resumed it", e.exception.message)
        self.assertEqual(e.exception.operation.error.reason, mc.DRAINING)

    def test_a_users_cancel_is_not_followed(self):
        cancelled = op("op-1", pb.OPERATION_STATE_CANCELLED, created=10, code=1,
                       message="cancelled after 2 of 6 steps", steps=2)
        self.fake.ops["op-1"] = cancelled
        self.fake.reports["op-1"] = reports(1, 2)
        self.fake.listed = [op("op-2", created=20), cancelled]
        with mc.Client(self.addr, token="") as c:
            run = c.train(steps=6)
            self.assertEqual([r.global_step for r in run.reports()], [1, 2])
            self.assertEqual(run.wait().state, pb.OPERATION_STATE_CANCELLED)
            self.assertEqual(run.followed, ["op-1"])
            self.assertEqual(run.result().steps_completed, 2)


class CursorTest(unittest.TestCase):
    def test_reports_are_never_repeated_and_gaps_are_listed(self):
        cursor = mc._follow.ReportCursor()
        accepted = [cursor.accept(r) for r in reports(1, 3)]
        cursor.switched()
        with self.assertWarns(RuntimeWarning):
            accepted += [cursor.accept(r) for r in reports(2, 4) + reports(8, 1)]
        self.assertEqual(accepted, [True, True, True, False, False, True, True, True])
        self.assertEqual(cursor.lost_global_steps, [6, 7])


if __name__ == "__main__":
    unittest.main()
