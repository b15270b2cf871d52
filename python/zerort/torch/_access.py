"""Finds, at stage 3, params read outside their own module's forward.

A module that reads another module's param (a tied output layer computing
F.linear(h, self.embed.weight)) would find that param's storage empty: its unit is gathered
only around its own module. Reading a param through its module (`self.embed.weight`) goes
through the module's `_parameters` dict, so each module owning a sharded param gets a dict
that notices a read of a released param while some module's forward runs: the innermost
running module is then told (UnitGathering._read_released), which gathers the unit at once and
around that module's forward and backward from then on, as register_external_parameter would
(DeepSpeed does the same with its ZeROOrderedDict). A read outside every forward (user code
between steps) is left alone: use zerort.torch.gathered() there.

The innermost running module is found from the interpreter's frames (the innermost call of
nn.Module's call machinery in progress), only when a released param is read: no hooks per
module, and a forward that raised leaves nothing behind.
"""
import collections
import sys

import torch

from . import _copies

# The code of nn.Module's call: a frame running it is a module call in progress.
_MODULE_CALL = torch.nn.Module._call_impl.__code__


def innermost_running_module(accept):
    """The innermost module whose call is in progress on this thread and for which
    `accept(module)` holds (a module of the engine's model), or None outside every such
    call. (A module run through torch.compile is not seen.)"""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _MODULE_CALL:
            module = frame.f_locals.get("self")
            if isinstance(module, torch.nn.Module) and accept(module):
                return module
        frame = frame.f_back
    return None


def runs_forward_hooks(module):
    """Whether PyTorch's call of `module` runs its forward hooks: it skips them all when the
    module and the process have no hooks of any kind (checked as PyTorch 1.13 and 2.x do)."""
    from torch.nn.modules import module as torch_module  # pylint: disable=import-outside-toplevel
    own = ("_backward_hooks", "_backward_pre_hooks", "_forward_hooks", "_forward_pre_hooks")
    process = ("_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_hooks",
               "_global_forward_pre_hooks")
    return (any(getattr(module, name, None) for name in own)
            or any(getattr(torch_module, name, None) for name in process))


class _WatchedParameters(collections.OrderedDict):
    """A module's `_parameters` that reports reads of the params in `watched` ({id(param):
    callback(param)}) to their callback."""

    watched = {}
    kind = dict  # the type of the dict it replaced

    def __getitem__(self, name):
        param = super().__getitem__(name)
        callback = self.watched.get(id(param))
        if callback is not None:
            callback(param)
        return param

    def __deepcopy__(self, memo):
        return _copies.plain_copy(self, self.kind, memo)

    def __reduce__(self):
        _copies.check_holds_values(self)
        return (self.kind, (list(self.items()),))


class _Unwatch:
    """Undoes watch(): remove() gives each module back a plain `_parameters` dict."""

    def __init__(self, swapped):
        self._swapped = swapped

    def remove(self):
        for module, kind in self._swapped:
            current = module.__dict__.get("_parameters")
            if isinstance(current, _WatchedParameters):
                module.__dict__["_parameters"] = kind(current)
        del self._swapped[:]


def watch(model, params, callback):
    """Makes every module of `model` that owns one of `params` report their reads through
    the module (module.name) to `callback(param)`. Returns a handle whose remove() undoes
    it (as the hooks' handles)."""
    watched = {id(p): callback for p in params}
    swapped = []
    for module in model.modules():
        own = module.__dict__.get("_parameters")
        if own is None or not any(id(p) in watched for p in own.values() if p is not None):
            continue
        replacement = _WatchedParameters(own)
        replacement.watched = watched
        replacement.kind = type(own)
        swapped.append((module, type(own)))
        module.__dict__["_parameters"] = replacement

    return _Unwatch(swapped)
