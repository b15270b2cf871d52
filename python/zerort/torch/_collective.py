"""Calls every rank must make, and the hint their errors carry when a rank did not.

save_checkpoint(), load_checkpoint(), state_dict() and, at stage 3, every forward are
collective. Ported trainers often make such a call on the main process only (`if rank == 0:
engine.save_checkpoint(...)`, an evaluation on rank 0 alone): the peers then never join it,
and the library's error says which collective did not match or timed out, not which call of
the trainer's was one-sided. every_rank_calls() adds that to such an error (hinted() on hot
paths, where a try block costs nothing and a context manager does).
"""
import contextlib

from .. import errors


def _peer_missed(error):
    """Whether `error` says a peer did not make the same collective call (on this rank's
    collective, or on a peer's, which broke the group first)."""
    if isinstance(error, (errors.DeadlineExceededError, errors.CancelledError)):
        return True
    return isinstance(error, errors.InvalidArgumentError) and " mismatch: " in error.message


def hinted(error, what, instead=""):
    """`error` (a ZeroError), with the reminder that `what` is made by every rank, and
    `instead` (a way out), appended when it says a peer did not join a collective."""
    if not _peer_missed(error):
        return error
    return type(error)(
        f"{error.message}. Note: {what} is collective: every rank makes it, with the same "
        "model, in the same order (not only rank 0 or the main process)" + instead,
        error.status)


@contextlib.contextmanager
def every_rank_calls(what, instead=""):
    """Re-raises a ZeroError of the block as hinted(error, what, instead), with its cause."""
    try:
        yield
    except errors.ZeroError as error:
        raise hinted(error, what, instead) from error.__cause__
