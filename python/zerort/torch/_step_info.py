"""What engine.step() returns: a read-only mapping with the keys "step", "skipped",
"grad_norm" and "loss_scale" (the dict it was before the norm could stay on the GPU).

On a GPU the engine decides the norm and clipping on the device and, unless the config says
"sync_grad_norm": true, leaves the norm there, so a step never waits for the GPU. The mapping
then reads "grad_norm" on first access (one wait for the GPU) and keeps it. Only the newest
step's norm is on the device: an older step's, first read after the next step, is None, with
a warning that says how to keep it.
"""
import collections.abc
import warnings


class StepInfo(collections.abc.Mapping):
    """One optimizer step's outcome, read like a dict."""

    def __init__(self, info, pending, engine_step, read_grad_norm, current_step):
        """`info`: the dict the engine's step returned; `pending`: its grad_norm is still on
        the device; `engine_step`: which of the engine's steps it was (counted from 1,
        skipped ones included); `read_grad_norm()`: reads the newest step's norm;
        `current_step()`: the engine's step count now."""
        self._info = dict(info)
        self._engine_step = engine_step
        self._read_grad_norm = read_grad_norm if pending else None
        self._current_step = current_step

    def __getitem__(self, key):
        if key == "grad_norm" and self._read_grad_norm is not None:
            if self._current_step() == self._engine_step:
                self._info["grad_norm"] = self._read_grad_norm()
            else:
                self._info["grad_norm"] = None
                warnings.warn(
                    f"zerort.torch: the gradient norm of optimizer step {self._engine_step} "
                    "stayed on the GPU and a later step has replaced it, so it reads as None. "
                    "Read info[\"grad_norm\"] (or engine.get_global_grad_norm()) before the "
                    "next step, or set \"sync_grad_norm\": true in the config to bring it to "
                    "the host every step.", stacklevel=2)
            self._read_grad_norm = None
        return self._info[key]

    def __contains__(self, key):
        return key in self._info

    def __iter__(self):
        return iter(self._info)

    def __len__(self):
        return len(self._info)

    def __repr__(self):
        shown = dict(self._info)
        if self._read_grad_norm is not None:
            shown["grad_norm"] = "<on the GPU>"
        return f"StepInfo({shown})"
