"""What engine.step() returns: a read-only mapping with the keys "step", "skipped",
"grad_norm" and "loss_scale", as the dict it was before the norm could stay on the GPU.

On a GPU the engine decides the norm and clipping on the device and, unless the config says
"sync_grad_norm": true, leaves the norm there, so a step never waits for the GPU. The mapping
then reads "grad_norm" on first access (one wait for the GPU) and keeps it. Only the newest
step's norm is on the device: reading an older step's after the next step is an error that
says so, never another step's value.
"""
import collections.abc
import math

from .. import errors


class StepInfo(collections.abc.Mapping):
    """One optimizer step's outcome, read like a dict."""

    def __init__(self, info, engine_step, read_grad_norm, current_step):
        """`info`: the dict the engine's step returned; `engine_step`: which of the engine's
        steps it was (counted from 1, skipped ones included); `read_grad_norm()`: reads the
        newest step's norm; `current_step()`: the engine's step count now."""
        self._info = dict(info)
        self._engine_step = engine_step
        self._read_grad_norm = None
        self._current_step = current_step
        if math.isnan(self._info["grad_norm"]):
            self._read_grad_norm = read_grad_norm

    def __getitem__(self, key):
        if key == "grad_norm" and self._read_grad_norm is not None:
            if self._current_step() != self._engine_step:
                raise errors.FailedPreconditionError(
                    f"zerort.torch: the gradient norm of optimizer step {self._engine_step} "
                    "stayed on the GPU and a later step has replaced it. Read "
                    "info[\"grad_norm\"] (or engine.get_global_grad_norm()) before the next "
                    "step, or set \"sync_grad_norm\": true in the config to have every step "
                    "bring it to the host.")
            self._info["grad_norm"] = self._read_grad_norm()
            self._read_grad_norm = None
        return self._info[key]

    def __iter__(self):
        return iter(self._info)

    def __len__(self):
        return len(self._info)

    def __repr__(self):
        shown = {k: ("<on the GPU>" if k == "grad_norm" and self._read_grad_norm else v)
                 for k, v in self._info.items()}
        return f"StepInfo({shown})"
