"""setuptools hooks of the memprofd-client package (pyproject.toml holds the
rest): build_py generates memprofd_client._proto from memprofd's proto/ with
grpcio-tools (gen_stubs.py beside this file) into the build directory, and
the runtime dependencies are pinned to at least what generated them.

The .proto files are read from MEMPROFD_PROTO_DIR, else from the checkout
this directory sits in (../../proto)."""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_stubs  # noqa: E402


def proto_dir():
    d = os.environ.get("MEMPROFD_PROTO_DIR") or os.path.join(HERE, "..", "..", "proto")
    if not gen_stubs.proto_files(d):
        raise SystemExit("memprofd-client: no memprofd/v1/*.proto under %s; build from a "
                         "memprofd checkout or set MEMPROFD_PROTO_DIR" % os.path.abspath(d))
    return os.path.abspath(d)


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        target = gen_stubs.generate(proto_dir(), self.build_lib)
        print("memprofd-client: generated", target)

    def get_outputs(self, include_bytecode=1):
        # The generated files belong to the wheel's record as well.
        outputs = super().get_outputs(include_bytecode)
        target = os.path.join(self.build_lib, "memprofd_client", "_proto")
        for root, _, files in os.walk(target):
            outputs.extend(os.path.join(root, f) for f in files)
        return outputs


def dependencies():
    from importlib import metadata
    tools = metadata.version("grpcio-tools")
    # grpcio-tools X.Y.Z bundles the protobuf whose gencode it writes; its own
    # dependency on protobuf names the runtime that gencode needs.
    proto_req = [r for r in metadata.requires("grpcio-tools") or [] if r.startswith("protobuf")]
    return ["grpcio>=%s" % tools] + (proto_req or ["protobuf>=4.21.6"])


setup(cmdclass={"build_py": BuildPyWithStubs}, install_requires=dependencies())
