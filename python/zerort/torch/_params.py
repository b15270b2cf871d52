"""The params an engine drives, and what must not change under it.

initialize() records, for every param it registers, the name, shape, dtype and device it
registered, and (stages 0-2, persistent stage-3 units) the address of the engine's memory
the param's `.data` views. Nothing of a param reaches the C ABI before it has been checked
against that record: a param cast by `model.half()` or given a smaller `.data` after
initialize is an error naming it, never a read or write past the end of a buffer. The same
record tells, at every step, that a param's `.data` was replaced (the engine no longer sees
what the model computes with), and which trainable params the engine does not know (added
to the model, or unfrozen, after initialize).

One engine at a time drives a param (claim()): a second initialize() on a model whose engine
is still open is refused.

Detacher runs just before an engine is closed, whichever way that happens (close(), the
communicator's close(), or the garbage collector's finalizer of an engine nobody closed; see
its docstring).
"""
import weakref

import torch

from .. import errors


# untyped_storage(tensor): the untyped storage (bytes) under `tensor`: untyped_storage()
# from PyTorch 2.0 on, _storage() before (storage() builds a typed wrapper in Python: slower).
# The method itself, chosen once: the hooks ask several times per param per step.
untyped_storage = getattr(torch.Tensor, "untyped_storage", None) or torch.Tensor._storage


def storage_bytes(tensor):
    """The size in bytes of the storage under `tensor` (0: no storage, a stage-3 param
    between uses)."""
    return untyped_storage(tensor).nbytes()


def same_storage(tensor, other):
    """Whether `tensor` and `other` share one storage (the same memory, whatever its size
    now: a stage-3 param between uses has a storage of no bytes): the storage objects
    compared by their C addresses."""
    return untyped_storage(tensor)._cdata == untyped_storage(other)._cdata


def resize_storage(tensor, numel):
    """Resizes the storage under `tensor` to `numel` elements (0 frees it)."""
    untyped_storage(tensor).resize_(numel * tensor.element_size())


class Registered:
    """A registered param: `name`, engine id `pid`, stage-3 `unit` (None below stage 3),
    and what initialize() registered: `shape`, `dtype`, `device`. `address`: the engine
    memory the param's `.data` views (None for a stage-3 param that is sharded). The param
    itself is held weakly (the engine keeps its own strong list)."""

    __slots__ = ("name", "pid", "unit", "shape", "dtype", "device", "address", "version",
                 "_ref")

    def __init__(self, name, param, pid, unit=None):
        self.name = name
        self.pid = pid
        self.unit = unit
        self.shape = tuple(param.shape)
        self.dtype = param.dtype
        self.device = param.device
        self.address = None
        # The param's version counter when its .data last became a view of `address` or the
        # engine last took its values (None: not a view of engine memory).
        self.version = None
        self._ref = weakref.ref(param)

    @property
    def param(self):
        """The param, or None once it is gone."""
        return self._ref()

    @property
    def numel(self):
        """The registered number of elements."""
        count = 1
        for size in self.shape:
            count *= size
        return count

    def matches(self, param):
        """Whether `param` still has the registered dtype, shape and device."""
        return (param.dtype == self.dtype and param.shape == self.shape
                and param.device == self.device)

    def changes(self, param):
        """What differs between `param` and what was registered: a list of phrases."""
        found = []
        if param.dtype != self.dtype:
            found.append(f"dtype {self.dtype} -> {param.dtype}")
        if tuple(param.shape) != self.shape:
            found.append(f"shape {self.shape} -> {tuple(param.shape)}")
        if param.device != self.device:
            found.append(f"device {self.device} -> {param.device}")
        return found

    def check(self, param, what):
        """Raises FailedPreconditionError when `param` no longer has the registered dtype,
        shape and device. `what`: the call being made, for the message."""
        if self.matches(param):
            return
        raise errors.FailedPreconditionError(
            f"zerort.torch: {what}: param \"{self.name}\" changed after initialize(): "
            f"{', '.join(self.changes(param))}. The engine keeps it as registered "
            f"({self.dtype}, shape {self.shape}, {self.device}); a model cast or moved "
            "after initialize (model.half(), model.to(...)) or a param's .data replaced by "
            "another tensor is not seen by it. Cast or move the model before initialize() "
            "(or let the config's bf16/fp16 cast it), copy new values in place (under "
            "torch.no_grad(): param.copy_(values)) or use engine.load_checkpoint(); to start "
            "over, engine.close() and initialize() again.",
            errors.FailedPreconditionError.status)

    def replaced_error(self, what):
        """The error for a param whose `.data` is no longer the engine's (same shape)."""
        return errors.FailedPreconditionError(
            f"zerort.torch: {what}: param \"{self.name}\"'s .data was replaced after "
            "initialize() by another tensor: the engine no longer sees the values the model "
            "computes with, and the model would no longer see the optimizer's steps. Copy "
            "new values in place instead (under torch.no_grad(): param.copy_(values)), or "
            "use engine.load_checkpoint(); to start over, engine.close() and initialize() "
            "again.", errors.FailedPreconditionError.status)


def untracked_error(what, name, was_frozen):
    """The error for a trainable param the engine does not drive."""
    how = ("was frozen (requires_grad=False) when initialize() ran and is trainable now"
           if was_frozen else "was added to the model after initialize()")
    return errors.FailedPreconditionError(
        f"zerort.torch: {what}: param \"{name}\" {how}; the engine registers its params "
        "once, at initialize(), and would never train this one. Build the model completely "
        "and set requires_grad before initialize() (engine.close(), then initialize() "
        "again, to start over), or freeze it (requires_grad_(False)).",
        errors.FailedPreconditionError.status)


FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class Inventory:
    """What initialize() found in a module: `trainable` [(name, param)] to register (each
    shared param once, zero-element ones left out), `empty` [(name, param)] (the
    zero-element trainable params), `tracked` {id: param} (every trainable param),
    `records` {engine id: Registered} (filled as the params are registered), `frozen`
    [(name, param)] (the frozen float params with elements, each shared one once: stage 3
    shards them), and the params frozen then."""

    def __init__(self, module):
        self.trainable, self.empty, self.tracked, self.records = [], [], {}, {}
        self.frozen = []
        self._empty_records = []
        seen_frozen = set()
        for name, param in module.named_parameters():
            if (param.requires_grad or id(param) in seen_frozen or param.numel() == 0
                    or param.dtype not in FLOAT_DTYPES):
                continue
            seen_frozen.add(id(param))
            self.frozen.append((name, param))
        for name, param in module.named_parameters():
            if not param.requires_grad or id(param) in self.tracked:
                continue
            self.tracked[id(param)] = param
            if param.numel() == 0:
                self.empty.append((name, param))
                self._empty_records.append(Registered(name, param, None))
            else:
                self.trainable.append((name, param))
        self._frozen = {id(p): weakref.ref(p) for p in module.parameters()
                        if not p.requires_grad}
        modules = list(module.modules())
        # Each module of `module` with its holdings: while they are unchanged, no trainable
        # param can be new to the engine.
        self._layout = (modules, self._holdings(modules))

    @staticmethod
    def _holdings(modules):
        """What each of `modules` holds now: its params and submodules (by identity) and
        which of its params are trainable (one walk, no call per module: step() asks)."""
        return [(tuple(map(id, sub._parameters.values())), tuple(map(id, sub._modules.values())),
                 tuple([p is not None and p.requires_grad for p in sub._parameters.values()]))
                for sub in modules]

    def _layout_unchanged(self, module):
        """Whether every module seen at initialize() holds what it held then (a walk of
        those modules: cheaper than naming every param)."""
        modules, held = self._layout
        return bool(modules) and modules[0] is module and self._holdings(modules) == held

    def check(self, module, params, views_unit_memory, what):
        """Raises FailedPreconditionError naming the first param that changed since
        initialize() in a way the engine cannot follow: another dtype, shape or device
        (Registered.check); a .data replaced by another tensor (no longer the engine's
        view; at stage 3 no longer a view of its unit's memory); a trainable param that
        the engine does not know (added to `module`, or unfrozen). `params`: the engine's
        [(name, param, id)]; `views_unit_memory(id, param)`: stage 3's (None below)."""
        for _, param, pid in params:
            record = self.records[pid]
            record.check(param, what)
            if record.address is not None:
                if param.data_ptr() != record.address:
                    raise record.replaced_error(what)
            elif not views_unit_memory(pid, param):
                raise record.replaced_error(what)
        for record in self._empty_records:
            param = record.param
            if param is not None:
                record.check(param, what)
        if self._layout_unchanged(module):
            return
        for name, param in module.named_parameters():
            if not param.requires_grad or id(param) in self.tracked:
                continue
            frozen = self._frozen.get(id(param))
            raise untracked_error(what, name, frozen is not None and frozen() is param)


# id(param) -> (weak reference to the param, the box of the engine that drives it). A box
# is emptied when its engine closes (core.Engine), so a stale entry never refuses anything.
_OWNERS = {}


def driven_param_name(named_params):
    """The name of the first of `named_params` ((name, param) pairs) that an open engine
    drives, or None."""
    for name, param in named_params:
        entry = _OWNERS.get(id(param))
        if entry is not None and entry[0]() is param and entry[1][0] is not None:
            return name
    return None


def claim_check(named_params):
    """Refuses params that an open engine already drives (a second initialize())."""
    name = driven_param_name(named_params)
    if name is not None:
        raise errors.FailedPreconditionError(
            f"zerort.torch: param \"{name}\" is already driven by an open engine: "
            "initialize() was called before on this model (or on a model sharing this "
            "param), and that engine would keep taking every gradient. Call close() on the "
            "first engine (the model keeps its trained values), then initialize() again.",
            errors.FailedPreconditionError.status)


def claim(params, box):
    """Records that the engine of `box` drives `params` (after claim_check)."""
    for param in params:
        key = id(param)
        _OWNERS[key] = (weakref.ref(param, lambda _, key=key: _OWNERS.pop(key, None)), box)


def release(params, box):
    """Forgets the claims of the engine of `box` on `params`."""
    for param in params:
        entry = _OWNERS.get(id(param))
        if entry is not None and entry[1] is box:
            del _OWNERS[id(param)]


def placeholder(param, dtype=None):
    """A same-shaped stand-in for a param whose values are gone: one NaN, expanded (reads
    give NaN, in-place writes are refused, no memory), of the param's dtype or `dtype`."""
    value = torch.full((), float("nan"), dtype=dtype or param.dtype, device=param.device)
    return value.expand(param.shape)


class Detacher:
    """What must happen to the model before its engine is closed, by any path: hooks
    removed, every param still viewing the engine's memory given its own copy (so the
    params own their values), claims released.

    It runs from engine.close(), from the communicator's close(), and from the garbage
    collector's finalizer of an engine that nobody closed (a finalizer runs at an arbitrary
    point, on any thread, possibly while other ranks are elsewhere). So it holds no
    reference to the TorchEngine (it would keep the engine alive) and only weak ones to the
    params (a param that is gone needs nothing), and it never calls a collective: it only
    copies memory this rank has. A stage-3 param whose unit is sharded has no values on
    this rank without a gather (a collective), so after a finalizer it gets a placeholder
    of its shape that reads as NaN (instead of a zero-byte storage that crashes a read);
    engine.close(), which is collective, gathers every param's full value first. Tensors
    derived from a param's data before the engine went (param.detach(), a slice) view the
    engine's memory themselves: that memory stays allocated as long as any of them exists
    (core.Engine.memory_owner), so they stay valid with the last values.
    """

    def __init__(self, box):
        self._box = box
        self.records = []  # Registered, shared with the engine (addresses updated there)
        self.handles = []  # lists of removable hook handles, shared with their owners
        self.claimed = []  # weak references to the claimed params

    def __call__(self):
        for handles in self.handles:
            for handle in handles:
                handle.remove()
            del handles[:]
        with torch.no_grad():
            for record in self.records:
                param = record.param
                if param is None or param.numel() == 0:
                    continue
                if record.address is not None and param.data_ptr() == record.address:
                    param.data = param.data.clone()
                elif record.address is None and storage_bytes(param.data) == 0:
                    param.data = placeholder(param)
        release([p for p in (ref() for ref in self.claimed) if p is not None], self._box)
