"""memprofd-client's build backend: setuptools' (setuptools.build_meta),
with what the generated gRPC stubs need.

- From a checkout (no src/memprofd_client/_proto), building an sdist or a
  wheel needs the generator, grpcio-tools GENERATOR (setup.py generates the
  stubs from ../../proto with it); from an sdist, which carries them, only
  setuptools.
- An editable install is refused, saying what to do instead: the stubs are
  generated into the wheel, not into src/, so an editable tree would lack them.
"""

import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every other hook as is)

# The oldest generator whose code the package supports; its gencode
# (protobuf 4.25) runs on protobuf 4.21.6 to 7.x. Keep in step with setup.py
# and deploy/requirements.txt.
GENERATOR = "grpcio-tools==1.62.3"
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _generator():
    generated = os.path.isdir(os.path.join(_HERE, "src", "memprofd_client", "_proto"))
    return [] if generated else [GENERATOR]


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + _generator()


def get_requires_for_build_sdist(config_settings=None):
    return _setuptools.get_requires_for_build_sdist(config_settings) + _generator()


_NO_EDITABLE = (
    "memprofd-client cannot be installed in editable mode: its gRPC stubs are generated "
    "into the wheel, not into src/. Install it (pip install ./clients/python), or use the "
    "source tree as the tests do: cmake --build build --target memprofd_python_client, then "
    "PYTHONPATH=clients/python/src:build/clients-python.")


def get_requires_for_build_editable(config_settings=None):
    raise SystemExit(_NO_EDITABLE)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    raise SystemExit(_NO_EDITABLE)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    raise SystemExit(_NO_EDITABLE)
