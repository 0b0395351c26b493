"""Every memprofd.v1 message and enum in one namespace:

    from memprofd_client import pb
    pb.TrainRequest(steps=10), pb.OPERATION_STATE_SUCCEEDED, pb.SnapshotDtype.Name(2)
"""

from . import _stubs  # noqa: F401  (one clear ImportError when the stubs are missing)
from ._proto.memprofd.v1.memory_pb2 import *  # noqa: F401,F403
from ._proto.memprofd.v1.memprofd_pb2 import *  # noqa: F401,F403
from ._proto.memprofd.v1.model_pb2 import *  # noqa: F401,F403
from ._proto.memprofd.v1.operation_pb2 import *  # noqa: F401,F403
from ._proto.memprofd.v1.snapshot_pb2 import *  # noqa: F401,F403
from ._proto.memprofd.v1.train_pb2 import *  # noqa: F401,F403
