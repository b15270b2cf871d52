"""Every non-OK zero_status as a Python exception carrying the status and the message."""


class ZeroError(RuntimeError):
    """A ZeroRT call failed. `status` is the zero_status code, `message` its text."""
    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class CancelledError(ZeroError):
    """A collective was abandoned by a rank; the communicator group is broken."""
    status = 1


class InvalidArgumentError(ZeroError, ValueError):
    """Bad input: a wrong shape, an unknown config key, a value out of range."""
    status = 3


class DeadlineExceededError(ZeroError, TimeoutError):
    """A collective did not complete within guard.timeout_s: a peer never joined."""
    status = 4


class NotFoundError(ZeroError):
    """Something named does not exist (a param id, a checkpoint)."""
    status = 5


class AlreadyExistsError(ZeroError):
    """A name registered twice."""
    status = 6


class ResourceExhaustedError(ZeroError, MemoryError):
    """Out of memory, or out of bucket buffers."""
    status = 8


class FailedPreconditionError(ZeroError):
    """A call out of order (e.g. a step before backward ended)."""
    status = 9


class UnimplementedError(ZeroError, NotImplementedError):
    """A feature this build or this package does not have."""
    status = 12


class InternalError(ZeroError):
    """An MPI, NCCL or CUDA error, or a bug."""
    status = 13


class UnavailableError(ZeroError):
    """A device or backend that is not there (no GPU, no MPI)."""
    status = 14


class AbortedError(ZeroError):
    """Another rank failed its part of a collective call (its error says why), or the run
    cannot go on (an fp16 overflow at the minimum loss scale)."""
    status = 10


class DataLossError(ZeroError):
    """A damaged checkpoint, or replicas that should be identical differ
    (guard.replica_check_every)."""
    status = 15


class DuplicateGradientError(ZeroError):
    """A param's gradient arrived after its bucket was reduced (see the message)."""
    status = 100


class UnusedParametersError(ZeroError):
    """Params got no gradient in an iteration (see the message)."""
    status = 101


_BY_STATUS = {cls.status: cls for cls in (
    CancelledError, InvalidArgumentError, DeadlineExceededError, NotFoundError,
    AlreadyExistsError, ResourceExhaustedError, FailedPreconditionError,
    AbortedError, UnimplementedError, InternalError, UnavailableError, DataLossError,
    DuplicateGradientError, UnusedParametersError)}


def error_for(status, message):
    """The exception for a non-OK `status` (ZeroError for codes without a class)."""
    cls = _BY_STATUS.get(status, ZeroError)
    return cls(message, status)
