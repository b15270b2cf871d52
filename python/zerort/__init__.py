"""ZeroRT from Python: a ZeRO-style sharded optimizer runtime over its C ABI (libzerort.so).

    import zerort            # communicators, engines, exceptions (no PyTorch needed)
    import zerort.torch      # the PyTorch integration: zerort.torch.initialize(model, config)

The library is found through ZERORT_LIBRARY, the copy a pip install put inside this package,
the build tree (build/lib/libzerort.so beside this package's source), an install prefix, or
the dynamic loader's path.
"""
from .core import (CheckpointReader, Communicator, Engine, install_preemption_handler,
                   external_communicator, local_group, mpi_communicator, nccl_communicator,
                   version)
from .errors import (AbortedError, AlreadyExistsError, CancelledError, DataLossError,
                     DeadlineExceededError, DuplicateGradientError,
                     FailedPreconditionError, InternalError,
                     InvalidArgumentError, NotFoundError,
                     ResourceExhaustedError, UnavailableError,
                     UnimplementedError, UnusedParametersError, ZeroError)

__all__ = [
    "CheckpointReader", "Communicator", "Engine", "external_communicator",
    "install_preemption_handler", "local_group",
    "mpi_communicator", "nccl_communicator", "version", "AbortedError",
    "ZeroError", "CancelledError", "InvalidArgumentError",
    "DeadlineExceededError", "NotFoundError", "AlreadyExistsError",
    "ResourceExhaustedError", "FailedPreconditionError", "UnimplementedError",
    "InternalError", "UnavailableError", "DataLossError",
    "DuplicateGradientError", "UnusedParametersError",
]
