"""Foundation: the real memprofd over the wire with an independent Python client."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import grpc

import harness
from harness import Daemon, health_pb2, pb, reflection_pb2


class ServingTest(harness.DaemonTestCase):
    def test_health_is_serving_for_server_and_service(self):
        for service in ("", "memprofd.v1.Memprofd"):
            resp = self.d.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            self.assertEqual(resp.status, health_pb2.HealthCheckResponse.SERVING, service)

    def test_reflection_lists_the_service(self):
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = list(self.d.reflection.ServerReflectionInfo(iter([req]), timeout=10))
        names = [s.name for s in responses[0].list_services_response.service]
        self.assertIn("memprofd.v1.Memprofd", names)

    def test_status_answers_with_build_and_device(self):
        status = self.d.call("GetStatus", pb.GetStatusRequest())
        self.assertEqual(status.build.version, "0.1.0")
        self.assertTrue(status.build.torch_version.startswith("1.") or
                        status.build.torch_version.startswith("2."))
        self.assertEqual(status.device, "cpu")
        self.assertEqual(status.serving_state, "SERVING")
        self.assertGreaterEqual(status.uptime_seconds, 0)
        self.assertIn("operations", status.build.features)

    def test_unknown_operation_is_not_found_with_a_message(self):
        for method, req in (("GetOperation", pb.GetOperationRequest(id="op-404")),
                            ("CancelOperation", pb.CancelOperationRequest(id="nope")),
                            ("WaitOperation", pb.WaitOperationRequest(id="x"))):
            with self.assertRaises(grpc.RpcError) as e:
                self.d.call(method, req)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, method)
            self.assertIn("no operation with id", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            list(self.d.stub.WatchOperation(pb.WatchOperationRequest(id="x"), timeout=10))
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_list_operations_rejects_unknown_kind(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("ListOperations", pb.ListOperationsRequest(kind=42))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(len(self.d.call("ListOperations", pb.ListOperationsRequest()).operations), 0)

    def test_metrics_carry_build_info_and_rpc_counts(self):
        self.d.call("GetStatus", pb.GetStatusRequest())
        text = self.d.metrics_text()
        self.assertIn('memprofd_build_info{device="cpu"', text)
        self.assertGreaterEqual(
            harness.metric(text, "memprofd_rpc_requests_total", code="OK", method="GetStatus"), 1)
        self.assertIn("process_resident_memory_bytes", text)
        self.assertIn("process_start_time_seconds", text)
        with tempfile.NamedTemporaryFile("w", suffix=".prom") as f:
            f.write(text)
            f.flush()
            with open(f.name) as inp:
                r = subprocess.run(["promtool", "check", "metrics"], stdin=inp, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_every_metric_says_rank_0_node_0_in_a_single_process(self):
        text = self.d.metrics_text()
        samples = harness.metric_samples(text)
        names = {n for n, _, _ in samples}
        # The server's registry, the process collectable and the session's.
        for name in ("memprofd_build_info", "process_start_time_seconds",
                     "memprofd_train_steps_total", "memprofd_train_step_seconds_count"):
            self.assertIn(name, names)
        unlabelled = [(n, l) for n, l, _ in samples
                      if (l.get("rank"), l.get("node")) != ("0", "0")]
        self.assertEqual(unlabelled, [])
        self.assertEqual(harness.metric(text, "memprofd_world_size"), 1)

    def test_memprofctl_status_and_health(self):
        r = self.d.ctl("status")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("device:     cpu", r.stdout)
        # Flags may stand after the command; --json prints proto field names.
        r = self.d.ctl("status", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('"serving_state":"SERVING"', r.stdout)
        r = self.d.ctl("health", "--service=memprofd.v1.Memprofd")
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "SERVING"))

    def test_memprofctl_exit_codes(self):
        r = self.d.ctl("operations", "get", "op-404")
        self.assertEqual(r.returncode, 1)
        self.assertIn("NOT_FOUND", r.stderr)
        r = self.d.ctl("frobnicate")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown command", r.stderr)
        r = subprocess.run([harness.MEMPROFCTL, "--addr=127.0.0.1:%d" % harness.free_port(),
                            "--timeout_ms=2000", "status"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 3, r.stderr)


class AuthTest(harness.DaemonTestCase):
    TOKEN = "s3cret-token"

    def test_missing_token_is_unauthenticated(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.d.stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        self.assertIn("authorization", e.exception.details())

    def test_wrong_token_is_unauthenticated(self):
        for value in ("Bearer wrong", "Bearer s3cret-token2", "s3cret-token", "Bearer "):
            with self.assertRaises(grpc.RpcError) as e:
                self.d.stub.GetStatus(pb.GetStatusRequest(), timeout=10,
                                      metadata=[("authorization", value)])
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED, value)

    def test_streams_check_the_token_too(self):
        with self.assertRaises(grpc.RpcError) as e:
            list(self.d.stub.WatchOperation(pb.WatchOperationRequest(id="op-1"), timeout=10))
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)

    def test_right_token_and_health_without_token(self):
        status = self.d.call("GetStatus", pb.GetStatusRequest())
        self.assertEqual(status.serving_state, "SERVING")
        resp = self.d.health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        self.assertEqual(resp.status, health_pb2.HealthCheckResponse.SERVING)
        r = self.d.ctl("status")  # memprofctl with --token_file
        self.assertEqual(r.returncode, 0, r.stderr)


class ShutdownTest(unittest.TestCase):
    def test_sigterm_exits_zero_within_5s_with_a_client_connected(self):
        d = Daemon()
        try:
            updates = []
            stream = d.health.Watch(health_pb2.HealthCheckRequest(service="memprofd.v1.Memprofd"))

            def read():
                try:
                    for u in stream:
                        updates.append(u.status)
                except grpc.RpcError:
                    pass

            reader = threading.Thread(target=read)
            reader.start()
            deadline = time.time() + 10
            while not updates and time.time() < deadline:
                time.sleep(0.05)
            self.assertEqual(updates[:1], [health_pb2.HealthCheckResponse.SERVING])
            code, seconds = d.stop(signal.SIGTERM, timeout=5)
            reader.join(timeout=5)
            self.assertEqual(code, 0, d.output())
            self.assertLess(seconds, 5.0)
            self.assertIn("draining", d.output())
        finally:
            d.close()

    def test_sigint_exits_zero(self):
        d = Daemon()
        try:
            code, _ = d.stop(signal.SIGINT, timeout=5)
            self.assertEqual(code, 0, d.output())
        finally:
            d.close()


@unittest.skipUnless(shutil.which("openssl"), "openssl not installed")
class TlsTest(unittest.TestCase):
    def test_tls_serves_and_refuses_plaintext(self):
        tmp = tempfile.TemporaryDirectory()
        cert, key = os.path.join(tmp.name, "cert.pem"), os.path.join(tmp.name, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                        "-keyout", key, "-out", cert], check=True, capture_output=True)
        d = Daemon("--tls_cert=" + cert, "--tls_key=" + key)
        try:
            with open(cert, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            with grpc.secure_channel("localhost:%d" % d.grpc_port, creds) as ch:
                stub = harness.memprofd_pb2_grpc.MemprofdStub(ch)
                self.assertEqual(stub.GetStatus(pb.GetStatusRequest(), timeout=10).serving_state, "SERVING")
            with self.assertRaises(grpc.RpcError):
                d.stub.GetStatus(pb.GetStatusRequest(), timeout=5)  # plaintext is refused
            r = subprocess.run([harness.MEMPROFCTL, "--addr=localhost:%d" % d.grpc_port,
                                "--tls_ca=" + cert, "health"], capture_output=True, text=True, timeout=30)
            self.assertEqual((r.returncode, r.stdout.strip()), (0, "SERVING"), r.stderr)
        finally:
            d.close()
            tmp.cleanup()


class BadStartTest(unittest.TestCase):
    """Bad flags: a clear message and a non-zero exit, never a hang."""

    def run_memprofd(self, *flags):
        return subprocess.run([harness.MEMPROFD, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0"]
                              + list(flags), capture_output=True, text=True, timeout=60)

    def test_unknown_flag(self):
        r = self.run_memprofd("--no_such_flag=1")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no_such_flag", r.stderr)

    def test_unparsable_addresses(self):
        for flag in ("--listen=localhost", "--listen=127.0.0.1:99999", "--metrics_listen=abc:xyz",
                     "--listen=:50051"):
            r = self.run_memprofd(flag)
            self.assertNotEqual(r.returncode, 0, flag)
            self.assertIn("is not a listen address", r.stderr, flag)

    def test_port_in_use(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            for flag in ("--listen=127.0.0.1:%d" % port, "--metrics_listen=127.0.0.1:%d" % port):
                r = self.run_memprofd(flag)
                self.assertNotEqual(r.returncode, 0, flag)
                self.assertIn("port in use", r.stderr, flag)

    def test_unreadable_token_file(self):
        r = self.run_memprofd("--auth_token_file=/nonexistent/token")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot read --auth_token_file", r.stderr)
        with tempfile.NamedTemporaryFile("w") as f:
            f.write("\n")
            f.flush()
            r = self.run_memprofd("--auth_token_file=" + f.name)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("holds no token", r.stderr)

    def test_bad_device_and_log_level(self):
        r = self.run_memprofd("--device=tpu")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("bad device", r.stderr)
        r = self.run_memprofd("--device=cuda:0")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cuda", r.stderr)
        r = self.run_memprofd("--log_level=chatty")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--log_level", r.stderr)

    def test_bad_offload_flags(self):
        for flag, needle in (("--offload_prefetch_depth=-1", "--offload_prefetch_depth"),
                             ("--offload_prefetch_depth=many", "--offload_prefetch_depth"),
                             ("--offload_target=tape", "--offload_target"),
                             ("--max_copies_in_flight=0", "--max_copies_in_flight")):
            r = self.run_memprofd(flag)
            self.assertNotEqual(r.returncode, 0, flag)
            self.assertIn(needle, r.stderr, flag)

    def test_a_plan_cap_that_is_not_positive_is_refused(self):
        for value in ("0", "-1", "nan"):
            r = self.run_memprofd("--max_plan_seconds=" + value)
            self.assertNotEqual(r.returncode, 0, value)
            self.assertIn("--max_plan_seconds", r.stderr, value)

    def test_public_address_without_token_warns(self):
        d = Daemon("--listen=0.0.0.0:0")
        try:
            self.assertIn("without --auth_token_file", d.output())
        finally:
            d.close()

    def test_half_tls_config(self):
        r = self.run_memprofd("--tls_cert=/etc/hostname")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--tls_key", r.stderr)


@unittest.skipUnless(shutil.which("prometheus") and shutil.which("promtool"), "prometheus not installed")
class PrometheusTest(unittest.TestCase):
    def test_real_prometheus_scrapes_build_info(self):
        d = Daemon()
        try:
            with harness.Prometheus(d.metrics_port) as prom:
                deadline = time.time() + 60
                out = ""
                while time.time() < deadline:
                    code, out = prom.query("memprofd_build_info")
                    if code == 0 and "memprofd_build_info" in out:
                        break
                    time.sleep(1)
                self.assertIn("memprofd_build_info", out)
                self.assertIn('device="cpu"', out)
                self.assertIn("=> 1", out)
        finally:
            d.close()


if __name__ == "__main__":
    unittest.main()
