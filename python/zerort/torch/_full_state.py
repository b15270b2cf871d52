"""A param's full fp32 values that live sharded in the engine, under DeepSpeed's names:

    safe_get_full_fp32_param(param)                   # the fp32 master weights
    safe_get_full_optimizer_state(param, "exp_avg")   # or "exp_avg_sq", "momentum_buffer"
    safe_get_full_grad(param)                         # the gradient step() will apply
    safe_set_full_fp32_param(param, value)            # and the param, rounded to its dtype
    safe_set_full_optimizer_state(param, value, "exp_avg")

Each returns a new fp32 tensor of the param's shape on its device, assembled from every
rank's part (core.Engine.get_full_state): collective at stages 1-3, so every rank asks for
the same params in the same order. As DeepSpeed's, each returns None for a param of the
model that the optimizer does not step (a frozen one, one without elements). A key the
optimizer does not keep (exp_avg_sq of SGD, momentum_buffer of AdamW) is refused.

The gradient is the one the next optimizer step applies (summed over the accumulation
window, averaged over the ranks, loss scale divided out, before clipping): read it after the
backward of the window's last micro-batch and before step(), as DeepSpeed's. Reading it
ends that micro-batch (as step() would: its gradients are reduced; a rank whose last
micro-batch had no backward ends it as step() does), so no gradient may arrive between the
read and step() (or zero_grad(), which drops them). The weights and moments (unchanged over
an accumulation window) are read after any micro-batch's step() call, or before the first
backward: not between a backward and its step().

FSDP's engine.clip_grad_norm_(max_norm) reads the same gradient's global norm at the same
point, and the next step clips to max_norm (instead of the config's gradient_clipping).
"""
import torch

from .. import errors
from ._collective import every_rank_calls
from ._config import optimizer_type
from ._gathered import driver_of

# DeepSpeed's (and PyTorch's) optimizer state keys -> the engine's moment buffer, and the
# optimizer types that keep it.
_STATE_KEYS = {"exp_avg": ("first_moment", ("adamw", "adam", "lamb", "lion")),
               "exp_avg_sq": ("second_moment", ("adamw", "adam", "lamb")),
               "momentum_buffer": ("first_moment", ("sgd",))}


class FullStateMethods:
    """TorchEngine's reads and sets of a param's full fp32 values, and of the gradient's norm
    (see the module docstring). Uses TorchEngine's _engine, _check_model, _pid_of, _names,
    _records, _handed_since_step_call, _graph_forward, _micro_batches, _window_ended,
    _versioned, _between_steps, _take_written_params, _torch_device,
    gradient_accumulation_steps and _end_micro_batch."""

    def full_state(self, param, state):
        """The full fp32 `state` of `param` ("weights", "first_moment", "second_moment" or
        "grad"), a tensor of its shape on its device; None for a param of the model the
        optimizer does not step. Collective at stages 1-3."""
        what = f"the full {state} of a param"
        pid = self._stepped_pid(param, what)
        if pid is None:
            return None
        if state == "grad":
            self._end_window_for_grad_read("safe_get_full_grad")
        elif self._handed_since_step_call:
            raise errors.FailedPreconditionError(
                f"zerort.torch: {what} can be read after a micro-batch's step() (or before "
                "any backward), not between a backward and its step(): the engine is inside "
                "that micro-batch. The weights and moments stay the same over the whole "
                "accumulation window, so read them after the step() call",
                errors.FailedPreconditionError.status)
        values = torch.empty(self._records[pid].shape, dtype=torch.float32)
        with every_rank_calls(f"safe_get_full_* ({state})"):
            self._engine.get_full_state(pid, state, values.data_ptr())
        return values.to(param.device)

    def set_full_state(self, param, state, value):
        """Sets the full fp32 `state` of `param` ("weights", which also sets the param
        rounded to its dtype, "first_moment" or "second_moment") from `value`, a tensor of
        its shape. Collective: every rank calls it with the same value and keeps its part.
        Nothing for a param the optimizer does not step, as DeepSpeed's. After a
        micro-batch's step(), not between a forward with gradients and its step(); inside an
        accumulation window the earlier micro-batches' gradients stay those of the old
        weights, as in PyTorch."""
        what = f"setting the full {state} of a param"
        pid = self._stepped_pid(param, what)
        if pid is None:
            return
        shape = tuple(self._records[pid].shape)
        wrong_shape = tuple(value.shape) != shape
        mid_window = self._handed_since_step_call or self._graph_forward
        # Refused on every rank when any rank must refuse: the engine's call compares the
        # ranks' values, so a rank refusing alone would leave its peers waiting there.
        if self._any_rank(wrong_shape or mid_window):
            if mid_window and not wrong_shape:
                raise errors.FailedPreconditionError(
                    f"zerort.torch: {what} is done after a micro-batch's step() (or before any "
                    "forward), not between a forward with gradients and its step(): that "
                    "micro-batch's gradient would mix the old and the new values",
                    errors.FailedPreconditionError.status)
            raise errors.InvalidArgumentError(
                f"zerort.torch: {what} \"{self._names[pid]}\": the value's shape "
                f"{tuple(value.shape)} is not the param's {shape}" if wrong_shape else
                f"zerort.torch: {what} \"{self._names[pid]}\": refused on another rank "
                "(its error says why); nothing was set", errors.InvalidArgumentError.status)
        if self._versioned and self._between_steps():
            self._take_written_params()  # the script's own writes first; this one after them
        values = value.detach().to("cpu", torch.float32).contiguous()
        self._engine.set_full_state(pid, state, values.data_ptr())

    def _stepped_pid(self, param, what):
        """`param`'s id when the optimizer steps it, None for a param of the model it does
        not (frozen, or without elements); `what` names the call in errors."""
        self._check_model(what)
        pid = self._pid_of(param, what, module_params=True)
        return pid if pid is not None and pid in self._names else None

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """FSDP's clip_grad_norm_: the total L2 norm (a float32 tensor on the engine's
        device) of the gradient the next step() applies (summed over the window, averaged
        over the ranks, loss scale divided out), read after the window's last backward and
        before step(); that step clips it to `max_norm`, in place of the config's
        gradient_clipping, which later steps use again. max_norm inf reads the norm without
        clipping (FSDP's idiom), and so does 0 (the config's meaning; torch's would zero the
        gradient). Collective: every rank calls it with the same max_norm (a negative or nan
        one on any rank is refused on every rank). The norm is inf or nan when a gradient is
        (a step an fp16 loss scale then skips). norm_type other than 2 is named as
        unsupported."""
        if float(norm_type) != 2.0:
            raise errors.UnimplementedError(
                f"zerort.torch: clip_grad_norm_(norm_type={norm_type}) is not supported: the "
                "engine clips by the L2 norm (norm_type=2)", errors.UnimplementedError.status)
        self._check_model("clip_grad_norm_()")
        self._end_window_for_grad_read("clip_grad_norm_")
        with every_rank_calls("clip_grad_norm_()", ", with the same max_norm"):
            norm = self._engine.clip_grad_norm(float(max_norm))
        return torch.tensor(norm, dtype=torch.float32, device=self._torch_device)

    def _end_window_for_grad_read(self, call):
        """Ends the window's last micro-batch now, as step() would (its gradients reduced),
        for `call`, which reads the gradient: it exists from then until step(). Every rank
        takes the same way (the micro-batch count agrees across ranks), whether or not its
        own backward ran."""
        if self._window_ended:
            return
        if self._micro_batches + 1 != self.gradient_accumulation_steps:
            raise errors.FailedPreconditionError(
                f"zerort.torch: {call}: the gradient exists after the backward of "
                f"the last of the step's {int(self.gradient_accumulation_steps)} micro-batches "
                f"(gradient_accumulation_steps) and before step(); {self._micro_batches} "
                "ended so far", errors.FailedPreconditionError.status)
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
    """DeepSpeed's: the full fp32 optimizer state `optim_state_key` ("exp_avg" and
    "exp_avg_sq" of AdamW, Adam and LAMB, "exp_avg" of Lion, "momentum_buffer" of SGD) of
    `param` (collective at stages 1-3)."""
    engine = _engine_of(param, "safe_get_full_optimizer_state")
    return engine.full_state(param, _state_of(engine, optim_state_key,
                                              "safe_get_full_optimizer_state"))


def _state_of(engine, optim_state_key, call):
    """The engine's moment buffer that DeepSpeed's `optim_state_key` names."""
    kind = optimizer_type(engine.config)
    state, kinds = _STATE_KEYS.get(optim_state_key, (None, ()))
    if kind not in kinds:
        keys = sorted(key for key, (_, owners) in _STATE_KEYS.items() if kind in owners)
        raise errors.InvalidArgumentError(
            f"zerort.torch: {call}: the {kind} optimizer keeps no {optim_state_key!r}; its "
            f"keys: {keys}", errors.InvalidArgumentError.status)
    return state


def safe_set_full_fp32_param(param, value):
    """DeepSpeed's: sets the fp32 master weights of `param` to `value` (a tensor of its
    shape), and the param itself to them rounded to its dtype. Collective: every rank calls
    it with the same value."""
    _engine_of(param, "safe_set_full_fp32_param").set_full_state(param, "weights", value)


def safe_set_full_optimizer_state(param, value, optim_state_key):
    """DeepSpeed's: sets the optimizer state `optim_state_key` of `param` (the keys of
    safe_get_full_optimizer_state) to `value`, a tensor of its shape. Collective: every rank
    calls it with the same value."""
    engine = _engine_of(param, "safe_set_full_optimizer_state")
    engine.set_full_state(param, _state_of(engine, optim_state_key,
                                           "safe_set_full_optimizer_state"), value)


def safe_get_full_grad(param):
    """DeepSpeed's: the full fp32 gradient of `param` that the next optimizer step applies
    (averaged, unscaled, before clipping), after the window's last backward and before
    step() (collective at stages 1-3)."""
    return _engine_of(param, "safe_get_full_grad").full_state(param, "grad")
