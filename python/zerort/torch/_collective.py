"""Calls every rank must make, and the hint their errors carry when a rank did not.

save_checkpoint(), load_checkpoint(), state_dict() and, at stage 3, every forward are
collective. Ported trainers often make such a call on the main process only (`if rank == 0:
engine.save_checkpoint(...)`, an evaluation on rank 0 alone): the peers then never join it,
and the library's error says which collective did not match or timed out, not which call of
the trainer's was one-sided. every_rank_calls() adds that to such an error (hinted() on hot
paths, where a try block costs nothing and a context manager does).
"""
import contextlib

import torch

from .. import errors

_REDUCE_OPS = ("sum", "mean", "max", "min")


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


def all_reduce(tensor, op, comm, timeout):
    """Reduces `tensor` over every rank of `comm` (a zerort communicator), in place, and
    returns it: op "sum", "mean" (sum / world size), "max" or "min". Any floating dtype and
    device; the values travel as a host float32 copy (zero_comm_all_reduce_f32), so float64
    values are reduced at float32 precision. Collective (every rank calls it with the same
    shape); `timeout` in seconds."""
    if op not in _REDUCE_OPS:
        raise errors.InvalidArgumentError(
            f"zerort.torch: all_reduce op {op!r} is not one of {', '.join(_REDUCE_OPS)}")
    if not tensor.is_floating_point():
        raise errors.InvalidArgumentError(
            f"zerort.torch: all_reduce takes a floating-point tensor, not {tensor.dtype}")
    host = tensor.detach().to(device="cpu", dtype=torch.float32, copy=True).contiguous()
    if op == "min":
        host.neg_()  # min(x) = -max(-x)
    if host.numel():
        comm.all_reduce_f32(host.data_ptr(), host.numel(),
                            "max" if op in ("max", "min") else "sum", timeout)
    if op == "min":
        host.neg_()
    elif op == "mean":
        host.div_(comm.size)
    with torch.no_grad():
        tensor.copy_(host)
    return tensor
