"""A param's full fp32 values that live sharded in the engine, under DeepSpeed's names:

    safe_get_full_fp32_param(param)                   # the fp32 master weights
    safe_get_full_optimizer_state(param, "exp_avg")   # or "exp_avg_sq", "momentum_buffer"
    safe_get_full_grad(param)                         # the gradient step() will apply

Each returns a new fp32 tensor of the param's shape on its device, assembled from every
rank's part (core.Engine.get_full_state): collective at stages 1-3, so every rank asks for
the same params in the same order. The gradient is the one the next optimizer step applies
(summed over the accumulation window, averaged over the ranks, loss scale divided out,
before clipping): read it after the backward of the window's last micro-batch and before
step(), as DeepSpeed's. Reading it ends that micro-batch (as step() would: its gradients
are reduced), so no gradient may arrive between the read and step() (or zero_grad(), which
drops them). The weights and moments are read between micro-batches: after step(), or
before the first backward.
"""
import torch

from .. import errors
from ._gathered import driver_of

# DeepSpeed's (and PyTorch's) optimizer state keys -> the engine's moment buffers.
_STATE_KEYS = {"exp_avg": "first_moment", "exp_avg_sq": "second_moment",
               "momentum_buffer": "first_moment"}


class FullStateMethods:
    """TorchEngine's reads of a param's full fp32 values (see the module docstring). Uses
    TorchEngine's _engine, _pid_of, _in_micro_batch, _micro_batches, _window_ended,
    gradient_accumulation_steps and _end_micro_batch."""

    def full_state(self, param, state):
        """The full fp32 `state` of `param` ("weights", "first_moment", "second_moment" or
        "grad"), a tensor of its shape on its device. Collective at stages 1-3."""
        what = f"the full {state} of a param"
        pid = self._pid_of(param, what)
        if state == "grad":
            self._end_window_for_grad_read()
        elif self._in_micro_batch:
            raise errors.FailedPreconditionError(
                f"zerort.torch: {what} is read between micro-batches (after step(), or before "
                "the first backward); gradients of this micro-batch have arrived and step() "
                "has not ended it", errors.FailedPreconditionError.status)
        values = torch.empty(tuple(param.shape), dtype=torch.float32)
        self._engine.get_full_state(pid, state, values.data_ptr())
        return values.to(param.device)

    def _end_window_for_grad_read(self):
        """Ends the window's last micro-batch now (its gradients reduced), when its backward
        has run: the gradient exists from then until step()."""
        if self._window_ended:
            return
        last = self._micro_batches + 1 == self.gradient_accumulation_steps
        if not (self._in_micro_batch and last):
            raise errors.FailedPreconditionError(
                "zerort.torch: safe_get_full_grad: the gradient exists after the backward of "
                f"the last of the step's {int(self.gradient_accumulation_steps)} micro-batches "
                "(gradient_accumulation_steps) and before step(); "
                f"{self._micro_batches} ended so far, and "
                + ("one has begun" if self._in_micro_batch else "none has begun since"),
                errors.FailedPreconditionError.status)
        self._end_micro_batch()
        self._window_ended = True


def _engine_of(param, call):
    engine = driver_of(param)
    if engine is None:
        raise errors.InvalidArgumentError(
            f"zerort.torch: {call}: no open engine drives this param (of shape "
            f"{tuple(param.shape)}); pass a param of the model given to initialize()",
            errors.InvalidArgumentError.status)
    return engine


def safe_get_full_fp32_param(param):
    """DeepSpeed's: the full fp32 master weights of `param` (collective at stages 1-3)."""
    return _engine_of(param, "safe_get_full_fp32_param").full_state(param, "weights")


def safe_get_full_optimizer_state(param, optim_state_key):
    """DeepSpeed's: the full fp32 optimizer state `optim_state_key` ("exp_avg",
    "exp_avg_sq", or SGD's "momentum_buffer") of `param` (collective at stages 1-3)."""
    if optim_state_key not in _STATE_KEYS:
        raise errors.InvalidArgumentError(
            f"zerort.torch: safe_get_full_optimizer_state: key {optim_state_key!r} is not one "
            f"of {sorted(_STATE_KEYS)}", errors.InvalidArgumentError.status)
    engine = _engine_of(param, "safe_get_full_optimizer_state")
    return engine.full_state(param, _STATE_KEYS[optim_state_key])


def safe_get_full_grad(param):
    """DeepSpeed's: the full fp32 gradient of `param` that the next optimizer step applies
    (averaged, unscaled, before clipping), after the window's last backward and before
    step() (collective at stages 1-3)."""
    return _engine_of(param, "safe_get_full_grad").full_state(param, "grad")
