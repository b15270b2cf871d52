"""Finds, at stage 3, params read outside their own module's forward.

A module that reads another module's param (a tied output layer computing
F.linear(h, self.embed.weight)) would find that param's storage empty: its unit is gathered
only around its own module. Reading a param through its module (`self.embed.weight`) goes
through the module's `_parameters` dict, so each module owning a sharded param gets a dict
that notices a read of a released param while some module's forward runs: the innermost
running module is then told (UnitGathering.found_external), which gathers the unit at once and
around that module's forward and backward from then on, as register_external_parameter would
(DeepSpeed does the same with its ZeROOrderedDict). A read outside every forward (user code
between steps) is left alone: use zerort.torch.gathered() there.

The running modules are tracked by a forward pre-hook and a forward hook on every module of
the model (a forward that raises leaves its entry; the model's own forward starts afresh).
"""
import collections


class ForwardStack:
    """The modules of `model` whose forward is running now, innermost last."""

    def __init__(self, model):
        self.running = []
        self.handles = []
        for module in model.modules():
            self.handles.append(module.register_forward_pre_hook(
                lambda m, _i, root=module is model: self._enter(m, root)))
            self.handles.append(module.register_forward_hook(
                lambda m, _i, _o: self._leave(m)))

    def _enter(self, module, root):
        if root:
            del self.running[:]
        self.running.append(module)

    def _leave(self, module):
        while self.running:
            if self.running.pop() is module:
                break

    def innermost(self):
        """The innermost module running its forward, or None outside every forward."""
        return self.running[-1] if self.running else None


class _WatchedParameters(collections.OrderedDict):
    """A module's `_parameters` that reports reads of the params in `watched` ({id(param):
    callback(param)}) to their callback."""

    watched = {}

    def __getitem__(self, name):
        param = super().__getitem__(name)
        callback = self.watched.get(id(param))
        if callback is not None:
            callback(param)
        return param


def watch(model, params, callback):
    """Makes every module of `model` that owns one of `params` report their reads through
    the module (module.name) to `callback(param)`. Returns a function that undoes it."""
    watched = {id(p): callback for p in params}
    swapped = []
    for module in model.modules():
        own = module.__dict__.get("_parameters")
        if own is None or not any(id(p) in watched for p in own.values() if p is not None):
            continue
        replacement = _WatchedParameters(own)
        replacement.watched = watched
        swapped.append((module, type(own)))
        module.__dict__["_parameters"] = replacement

    def undo():
        for module, kind in swapped:
            current = module.__dict__.get("_parameters")
            if isinstance(current, _WatchedParameters):
                module.__dict__["_parameters"] = kind(current)
    return undo
