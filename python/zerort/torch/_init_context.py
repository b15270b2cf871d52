"""Building a model larger than one rank's memory: init_context, as DeepSpeed's zero.Init.

    with zerort.torch.init_context(comm):
        model = MyModel()                   # each module's params sharded as it is built
    engine = zerort.torch.initialize(model, config, comm)

Inside the block, when a module's __init__ returns (the outermost one, after its subclass's
own initialisation ran), the float params of its submodules are sharded: each is broadcast
from rank 0 (so every rank builds the same model, as if one rank had built it), this rank
keeps its contiguous 1/N slice of the flattened values, and the param's values are replaced
by a placeholder of its shape and dtype that takes no memory (reads give NaN; copy_ raises,
and a write that PyTorch lets through, fill_ or nn.init.constant_, is refused by
initialize(), naming the param). A module's own params wait for its parent's __init__ to return
(or for the block to end), because a parent may still initialise its children's params in
its own __init__ (PEFT's LoRA layer initialises its adapters' weights after building them).
A rank thus holds at any moment the slices so far plus the params of the module being
built and of its children, never the whole model.

initialize() puts the slices together again one param at a time (each rank broadcasts its
slice into a full-size temporary, which goes to the engine and is freed): at stage 3 no rank
ever holds more than one whole param; at stages 0-2, which keep every trainable param whole
on every rank, the params become whole again.

module.apply(fn) inside the block (Hugging Face's post_init: self.apply(self._init_weights)
at the end of the top-level __init__) visits the modules as PyTorch's does, children first,
and gives fn each module's own params whole: a sharded module's are put together (collective)
before fn(module) and sharded again after it from rank 0's values, so the init_weights of
every rank agree and no rank holds more than one module's params at once.

A block inside another on the same thread (a composite model's from_pretrained building its
parts, each under its own zero.Init) changes nothing: the outer one shards.

Between the block and initialize(), model.load_state_dict() of a state dict that names a
sharded param is refused (a load_state_dict pre-hook of each module built in the block):
pretrained weights load after initialize() with engine.load_module_state_dict().

Limits: other code that writes into a grandchild's params from the top-level __init__ (a
loop over self.modules() rather than apply()) finds them sharded (PyTorch raises on writing
the placeholder, or initialize() refuses the write; an out-of-place assignment, param.data =
..., is lost): initialise inside
each module's own __init__ or its parent's, through apply(), or build the model outside the
block. A cast or move of the model between the block and initialize() (model.half(),
.to(...)) makes full-size NaN tensors of the placeholders: give initialize() the model as the
block built it (a bf16/fp16 config casts the slices there). Classes defined inside
the block are not covered. Non-float params, 0-dim ones and buffers are not sharded.
"""
import contextlib
import math
import threading

import torch
from torch import nn

from .. import errors
from ._collective import all_reduce
from ._device import broadcast_tensor
from ._params import FLOAT_DTYPES, placeholder
from ._torch_communicator import default_communicator

_SHARD = "_zerort_init_shard"
_DEPTH = "_zerort_init_depth"
_VERSION = "_zerort_init_version"  # a sharded param's version counter when it was sharded


def _subclasses(cls):
    found, stack = [], [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                stack.append(sub)
    return found


def _bounds(numel, rank, world):
    return numel * rank // world, numel * (rank + 1) // world


def _shard_params(params, comm, timeout):
    """Broadcasts float `params` from rank 0 and keeps this rank's slices."""
    with torch.no_grad():
        for param in params:
            if (getattr(param, _SHARD, None) is not None or param.dim() == 0
                    or param.numel() == 0 or param.dtype not in FLOAT_DTYPES):
                continue
            broadcast_tensor(param.data, comm, 0, timeout)
            begin, end = _bounds(param.numel(), comm.rank, comm.size)
            setattr(param, _SHARD, param.detach().reshape(-1)[begin:end].clone())
            param.data = placeholder(param)
            setattr(param, _VERSION, param._version)


def _refuse_sharded_load(module, state_dict, prefix, *_):
    """A load_state_dict pre-hook of the modules a block built: a load that would write a
    param the block sharded (its placeholder) is refused, naming the way."""
    for name, param in module._parameters.items():
        if param is not None and prefix + name in state_dict and is_sharded(param):
            raise errors.FailedPreconditionError(
                f"zerort.torch: load_state_dict() would write \"{prefix + name}\", a param "
                "init_context sharded: until initialize() it holds only this rank's slice. "
                "Load after initialize() with engine.load_module_state_dict(state_dict) "
                "(every rank calls it; one module gathered at a time), or build the model "
                "outside the block", errors.FailedPreconditionError.status)


def _apply_with_whole_params(module, fn, block):
    """nn.Module.apply inside a block: children first, then fn(module) with the module's
    sharded params whole, sharded again from rank 0's values after it."""
    for child in module.children():
        child.apply(fn)
    own = [p for p in module.parameters(recurse=False) if is_sharded(p)]
    comm, timeout, _ = block
    with torch.no_grad():
        for param in own:
            param.data = materialize(param, comm, timeout)
    fn(module)  # on an exception the params stay whole, and the block ends unsharded
    _shard_params(own, comm, timeout)
    return module


class _Patch:
    """The wrapped __init__ of every nn.Module subclass, and nn.Module.apply, installed while
    any thread is inside an init_context block (in-process ranks are threads, each in its own
    block); a wrapper shards only for the thread whose block is open, with that block's
    communicator."""

    def __init__(self):
        self.lock = threading.Lock()
        self.users = 0
        self.originals = {}
        self.active = threading.local()  # .block: [comm, timeout, modules built in it]
        self.original_apply = nn.Module.apply

    def wrap_apply(self, original):
        active = self.active

        def apply(module, fn):
            block = getattr(active, "block", None)
            if block is None:
                return original(module, fn)
            return _apply_with_whole_params(module, fn, block)
        apply.__wrapped__ = original
        return apply

    def wrap(self, original):
        active = self.active

        def __init__(module, *args, **kwargs):
            block = getattr(active, "block", None)
            if block is None:
                return original(module, *args, **kwargs)
            depth = module.__dict__.get(_DEPTH, 0)
            module.__dict__[_DEPTH] = depth + 1
            try:
                original(module, *args, **kwargs)
            finally:
                module.__dict__[_DEPTH] = depth
            if depth == 0:  # the outermost __init__ of this module returned
                del module.__dict__[_DEPTH]
                comm, timeout, built = block
                built.append(module)
                module._register_load_state_dict_pre_hook(_refuse_sharded_load,
                                                          with_module=True)
                for child in module.children():
                    _shard_params(child.parameters(), comm, timeout)
        __init__.__wrapped__ = original
        return __init__

    def outer_block(self, comm):
        """The block this thread is inside already, or None. A nested block must name the
        outer one's communicator or none (InvalidArgumentError)."""
        block = getattr(self.active, "block", None)
        if block is not None and comm is not None and comm is not block[0]:
            raise errors.InvalidArgumentError(
                "zerort.torch.init_context: a block inside another must shard over the same "
                "ranks: give it the outer block's communicator, or none",
                errors.InvalidArgumentError.status)
        return block

    def enter(self, block):
        with self.lock:
            if self.users == 0:
                for cls in _subclasses(nn.Module):
                    if "__init__" in cls.__dict__ and not cls.__module__.startswith("torch.jit"):
                        self.originals[cls] = cls.__dict__["__init__"]
                        cls.__init__ = self.wrap(self.originals[cls])
                self.original_apply = nn.Module.apply
                nn.Module.apply = self.wrap_apply(self.original_apply)
            self.users += 1
        self.active.block = block

    def leave(self, shard):
        """Ends this thread's block; with `shard`, the params still whole (the outermost
        modules' own) are sharded (not after an exception: the peers may not be here)."""
        comm, timeout, built = self.active.block
        self.active.block = None
        try:
            for module in built if shard else ():
                _shard_params(module.parameters(recurse=False), comm, timeout)
        finally:
            self._uninstall()

    def _uninstall(self):
        with self.lock:
            self.users -= 1
            if self.users == 0:
                for cls, original in self.originals.items():
                    cls.__init__ = original
                self.originals.clear()
                # Unless another library wrapped it since (its wrapper then stays).
                if getattr(nn.Module.apply, "__wrapped__", None) is self.original_apply:
                    nn.Module.apply = self.original_apply


_PATCH = _Patch()


@contextlib.contextmanager
def init_context(comm=None, timeout_s=600.0):
    """Modules built inside the block keep only this rank's slice of their float params
    (see the module's docstring). Collective: every rank builds the same modules in the
    same order. `comm`: the ranks the engine will use; None means the launcher's ranks, as
    initialize(comm=None) takes them (a communicator of the block's own, closed as it ends:
    initialize() makes its own)."""
    outer = _PATCH.outer_block(comm)
    if outer is not None:  # nested (a composite model's from_pretrained): the outer one shards
        yield
        return
    owned = comm is None
    if owned:
        comm = default_communicator()
    if getattr(comm, "closed", False):
        raise errors.InvalidArgumentError(
            "zerort.torch.init_context(comm): give the open communicator that initialize() "
            "will use", errors.InvalidArgumentError.status)
    _PATCH.enter([comm, timeout_s, []])
    try:
        yield
    except BaseException:
        _PATCH.leave(shard=False)  # the peers may not be here: nothing collective, comm kept
        raise
    _PATCH.leave(shard=True)
    if owned:
        comm.close()


def refuse_lost_writes(module, comm, timeout):
    """initialize(): a FailedPreconditionError on every rank when some rank wrote in place
    into a sharded param of `module` after its block sharded it (nn.init.constant_, fill_ on
    its placeholder are taken and would be lost; through .data too, which moves no version
    counter: the placeholder's one element is then no longer NaN). Collective where the
    module has sharded params (on every rank alike: the block is collective)."""
    sharded = [(name, p) for name, p in module.named_parameters() if is_sharded(p)]
    if not sharded:
        return
    written = [name for name, p in sharded if p._version != getattr(p, _VERSION, p._version)
               or not math.isnan(p.data.reshape(-1)[0].item())]  # p.data: no version moves
    anywhere = all_reduce(torch.tensor([float(len(written))]), "max", comm, timeout)
    if anywhere.item() == 0:
        return
    where = "on another rank"
    if written:
        where = f'"{written[0]}"' + (f" and {len(written) - 1} more" if len(written) > 1 else "")
    raise errors.FailedPreconditionError(
        "zerort.torch.initialize: a param that init_context sharded was written in place "
        "after its block sharded it (" + where + "; "
        "nn.init.*_ or fill_ between the block and initialize()): it holds only a slice on "
        "each rank, so the write reached a placeholder and would be lost. Initialise params "
        "inside the block (in the module's __init__ or through model.apply(fn)), or after "
        "initialize(): a pretrained state dict with engine.load_module_state_dict(state_dict), "
        "other writes inside zerort.torch.gathered(params, modifier_rank=0) (DeepSpeed: "
        "GatheredParameters)",
        errors.FailedPreconditionError.status)


def is_sharded(param):
    """Whether init_context left `param` as this rank's slice only."""
    return getattr(param, _SHARD, None) is not None


def cast(module, dtype):
    """Casts the sharded float32 params of `module` to `dtype` (their slices, and the empty
    params' dtype) without reading their absent values; module.to(dtype) then leaves them."""
    for param in module.parameters():
        if is_sharded(param) and param.dtype == torch.float32:
            setattr(param, _SHARD, getattr(param, _SHARD).to(dtype))
            param.data = placeholder(param, dtype)


def materialize(param, comm, timeout):
    """The whole values of a param init_context sharded (a new tensor, on the param's device;
    collective: every rank calls it for the same params in the same order). Frees the slice."""
    shard = getattr(param, _SHARD)
    full = torch.empty(param.numel(), dtype=param.dtype, device=shard.device)
    for rank in range(comm.size):
        begin, end = _bounds(param.numel(), rank, comm.size)
        part = full[begin:end]
        if rank == comm.rank:
            part.copy_(shard)
        broadcast_tensor(part, comm, rank, timeout)
    delattr(param, _SHARD)
    return full.view(param.shape)
