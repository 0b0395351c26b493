"""memprofd_client: a Python client of memprofd's v1 gRPC API
(memprofd.v1.Memprofd), blocking (Client) and asyncio (AsyncClient).

    import memprofd_client as mc
    with mc.Client("127.0.0.1:50051") as c:
        run = c.train(steps=100, batch_size=8)
        for report in run.reports():
            print(report.global_step, report.loss)
        run.wait()

Messages and enums are in memprofd_client.pb; errors in memprofd_client.errors
(also exported here). The gRPC stubs under memprofd_client._proto are
generated from the daemon's proto/ when the package is built.
"""

import pkgutil

# The generated memprofd_client._proto may live in another directory on
# sys.path (the build tree's clients-python/ beside this source tree).
__path__ = pkgutil.extend_path(__path__, __name__)

from ._version import API_VERSION, __version__  # noqa: E402
from . import pb  # noqa: E402
from ._stubs import PROTO_FILES, PROTO_SHA256, SERVICE_NAME  # noqa: E402
from ._connect import (DEFAULT_ADDR, IDEMPOTENT_RPCS, RETRY_POLICY, TOKEN_ENV,  # noqa: E402
                       read_token_file)
from ._follow import DRAINING  # noqa: E402
from ._methods import DEFAULT, RPC_METHODS  # noqa: E402
from .errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded,  # noqa: E402
                     FailedPrecondition, Internal, InvalidArgument, MemprofdError, NotFound,
                     OutOfRange, PermissionDenied, ResourceExhausted, Unauthenticated,
                     Unavailable, Unimplemented, Unknown, error_for)
from .client import Client, OperationHandle, TrainOperation  # noqa: E402
from .aio import AsyncClient, AsyncOperationHandle, AsyncTrainOperation  # noqa: E402
from .data import (embedded_corpus, indexed_dataset, inline_tokens, text_file,  # noqa: E402
                   token_file)

__all__ = [
    "API_VERSION", "__version__", "pb", "PROTO_FILES", "PROTO_SHA256", "SERVICE_NAME",
    "DEFAULT_ADDR", "IDEMPOTENT_RPCS", "RETRY_POLICY", "TOKEN_ENV", "read_token_file",
    "DRAINING", "DEFAULT", "RPC_METHODS",
    "Client", "OperationHandle", "TrainOperation",
    "AsyncClient", "AsyncOperationHandle", "AsyncTrainOperation",
    "embedded_corpus", "indexed_dataset", "inline_tokens", "text_file", "token_file",
    # errors.__all__, in its order
    "MemprofdError", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
    "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
    "error_for",
]
