"""The generated stubs on every protobuf and grpcio the package states it
supports (pyproject.toml: protobuf>=4.21.6,<8, grpcio>=1.50): for each pair
below, a fresh venv from PyPI imports memprofd_client with warnings as
errors, round-trips messages and calls an in-process gRPC server through
Client.

    python runtime_matrix.py --stubs BUILD/clients-python

Needs PyPI: exits 0 saying it skipped when pip cannot reach it. ctest runs
it as client_python_runtimes (label slow: make test, not make check).
"""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# The oldest runtimes the gencode of grpcio-tools 1.62 needs, one of each
# major version since, and the newest.
PAIRS = [("4.21.6", "1.50.0"), ("5.26.1", "1.62.3"), ("5.29.5", "1.70.0"),
         ("6.30.0", "1.81.1"), ("6.33.5", "1.81.1"), ("7.36.2", "1.85.1")]

CHECK = r'''
import sys, warnings
warnings.simplefilter("error")
from concurrent import futures
import grpc, google.protobuf
import memprofd_client as mc
from memprofd_client import pb
from memprofd_client._stubs import memprofd_pb2_grpc
r = pb.TrainRequest(steps=3, data=pb.DataSource(embedded_corpus=True))
assert pb.TrainRequest.FromString(r.SerializeToString()) == r
assert pb.OperationState.Name(3) == "OPERATION_STATE_SUCCEEDED"
class S(memprofd_pb2_grpc.MemprofdServicer):
    def GetStatus(self, request, context):
        return pb.ServerStatus(serving_state="SERVING")
server = grpc.server(futures.ThreadPoolExecutor(2))
memprofd_pb2_grpc.add_MemprofdServicer_to_server(S(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
with mc.Client("127.0.0.1:%d" % port, token="") as c:
    assert c.get_status().serving_state == "SERVING"
server.stop(0)
print("protobuf", google.protobuf.__version__, "grpcio", grpc.__version__, "ok")
'''


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stubs", required=True, help="the directory holding memprofd_client/_proto")
    args = p.parse_args()
    src = os.path.join(os.path.dirname(HERE), "src")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="memprofd-runtimes-") as tmp:
        for protobuf, grpcio in PAIRS:
            venv = os.path.join(tmp, "v-%s-%s" % (protobuf, grpcio))
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
            py = os.path.join(venv, "bin", "python")
            r = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                "protobuf==" + protobuf, "grpcio==" + grpcio],
                               capture_output=True, text=True)
            if r.returncode != 0:
                if protobuf == PAIRS[0][0]:
                    print("skipped: pip cannot install from PyPI here (%s)"
                          % (r.stderr.strip().splitlines() or ["?"])[-1])
                    return 0
                print("protobuf %s grpcio %s: install failed:\n%s" % (protobuf, grpcio, r.stderr))
                failed += 1
                continue
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.path.abspath(args.stubs)]))
            r = subprocess.run([py, "-c", CHECK], capture_output=True, text=True, env=env)
            print(r.stdout.strip() or "protobuf %s grpcio %s: FAILED\n%s" % (
                protobuf, grpcio, r.stderr))
            failed += r.returncode != 0
    print("%d passed, %d failed" % (len(PAIRS) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
