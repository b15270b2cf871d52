"""Full values of stage-3 params in user code, and params used outside their module.

At stage 3 a param holds no values between its module's uses (_stage3.py). Two things
need its values elsewhere:

- a module that reads another module's param (a tied output layer computing
  F.linear(h, self.embed.weight)): register_external_parameter(module, param) makes
  `module`'s forward and backward gather the param's unit too, as DeepSpeed's function of
  the same name. Call it before initialize() (it is recorded on the module) or after it.
  Undeclared, a param read through its module in another module's forward is found as it
  is read (_access.py), one step later than declared;
- code outside any forward (inspecting, initialising or editing weights): the block
  `with zerort.torch.gathered(params, modifier_rank=None):` has every param's full values
  (collective: every rank enters and leaves it). With `modifier_rank` = r, rank r's values
  when the block ends are broadcast and set as every rank's (the engine's shards, and the
  optimizer's master copy; a param whose values the block left as they were is not set
  again, so a bf16/fp16 param keeps the bits its master holds below the param's), as
  DeepSpeed's GatheredParameters(modifier_rank=r). Writes
  are applied only when the block ends without an exception on every rank (where one rank's
  block raised, the others raise AbortedError; what a block wrote in place stays where it
  went: at stages 0-2 the views are the engine's memory), and only outside a micro-batch
  (after step(), or before the first forward).

Below stage 3 every param has its values; the block only applies `modifier_rank`'s writes.
"""
import contextlib
import ctypes
import hashlib
import warnings
import weakref

import torch

from .. import errors
from ._device import broadcast_tensor

_EXTERNAL_ATTRIBUTE = "_zerort_external_params"

# id(param) -> (weak reference to the param, weak reference to the TorchEngine driving it)
_DRIVERS = {}


def register_external_parameter(module, param):
    """Makes `module`'s forward and backward gather `param`'s stage-3 unit (a param another
    module owns, used in `module`'s forward). Before initialize(): recorded on `module`.
    After it: the engine driving `param` is told at once."""
    if not isinstance(module, torch.nn.Module) or not isinstance(param, torch.nn.Parameter):
        raise errors.InvalidArgumentError(
            "zerort.torch.register_external_parameter(module, param): module must be a "
            "torch.nn.Module and param a torch.nn.Parameter",
            errors.InvalidArgumentError.status)
    declared = module.__dict__.setdefault(_EXTERNAL_ATTRIBUTE, [])
    if not any(p is param for p in declared):
        declared.append(param)
    engine = driver_of(param)
    if engine is not None:
        engine.register_external_parameter(module, param)


def declared_external(module):
    """[(submodule, param)] declared by register_external_parameter on `module`'s tree."""
    return [(sub, param) for sub in module.modules()
            for param in sub.__dict__.get(_EXTERNAL_ATTRIBUTE, ())]


def drive(params, engine):
    """Records that `engine` drives `params` (for gathered() and register_external_...)."""
    reference = weakref.ref(engine)
    for param in params:
        key = id(param)
        _DRIVERS[key] = (weakref.ref(param, lambda _, key=key: _DRIVERS.pop(key, None)),
                         reference)


def driver_of(param):
    """The open TorchEngine driving `param`, or None."""
    entry = _DRIVERS.get(id(param))
    if entry is None or entry[0]() is not param:
        return None
    engine = entry[1]()
    return engine if engine is not None and not engine.closed else None


def _fingerprint(param):
    """A hash of `param`'s bytes, read through a copy (a numpy view would pin the storage,
    which stage 3 resizes when it releases the unit)."""
    data = param.detach().contiguous().cpu()
    raw = ctypes.string_at(data.data_ptr(), data.numel() * data.element_size())
    return hashlib.blake2b(raw, digest_size=16).digest()


@contextlib.contextmanager
def gathered(params, modifier_rank=None):
    """Full values of `params` (a param or an iterable of them, all driven by one open
    engine) inside the block; see the module's docstring. Collective."""
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    engines = {id(e): e for e in (driver_of(p) for p in params) if e is not None}
    if len(engines) > 1:
        raise errors.InvalidArgumentError(
            "zerort.torch.gathered: the params belong to different engines; use one block "
            "per engine", errors.InvalidArgumentError.status)
    if not engines:
        if modifier_rank is not None and params:
            raise errors.FailedPreconditionError(
                "zerort.torch.gathered: no open engine drives these params, so there is "
                "nothing to gather or write back (initialize() first)",
                errors.FailedPreconditionError.status)
        yield params
        return
    engine = next(iter(engines.values()))
    with engine.gathered(params, modifier_rank) as values:
        yield values


class GatheredMethods:
    """TorchEngine's part of the above: register_external_parameter() and gathered() on
    the engine."""

    def register_external_parameter(self, module, param):
        """Makes `module`'s forward and backward gather `param`'s stage-3 unit too: a param
        another module owns that `module` uses (a tied output layer's F.linear(h,
        self.embed.weight)), as DeepSpeed's register_external_parameter (_gathered.py).
        Nothing to do below stage 3."""
        pid = self._pid_of(param, "register_external_parameter()")
        if self._units is not None:
            self._units.add_units(module, self._units.units_of([pid]))

    @contextlib.contextmanager
    def gathered(self, params, modifier_rank=None):
        """Full values of `params` inside the block; with `modifier_rank`, that rank's
        values when the block ends become every rank's (_gathered.py). Collective."""
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        self._check_model("gathered()")
        pids = [self._pid_of(p, "gathered()", module_params=True) for p in params]
        if modifier_rank is not None and not 0 <= modifier_rank < self.world_size:
            raise errors.InvalidArgumentError(
                f"gathered(): modifier_rank {modifier_rank} is not a rank of this engine "
                f"(0..{self.world_size - 1})", errors.InvalidArgumentError.status)
        registered = [pid for pid in pids if pid is not None]
        if self._stream is not None:
            self._follow_engine_stream()  # the values are the engine's (its step's)
        units = self._units.units_of(registered) if self._units is not None else []
        if self._units is not None:
            self._units.hold(units)
        try:
            entered = ([self._entry_state(p, pid) for p, pid in zip(params, pids)]
                       if modifier_rank is not None else [])
            versions = [p._version for p in params]
            failed = True
            try:
                yield params
                failed = False
                if modifier_rank is None:
                    self._warn_about_dropped_writes(params, pids, versions)
            finally:
                # Every rank learns whether any rank's block raised: then no rank writes
                # (a rank that skipped the broadcasts would leave its peers waiting), and the
                # ranks whose block ended well raise too, so that none goes on alone.
                if modifier_rank is not None and self._any_rank(failed):
                    if not failed:
                        raise errors.AbortedError(
                            "zerort.torch: gathered(modifier_rank=...): another rank's block "
                            "raised (its error says why), so no rank's writes were applied",
                            errors.AbortedError.status)
                elif modifier_rank is not None:
                    self._write_from(modifier_rank, params, pids, entered)
        finally:
            if self._units is not None:
                self._units.unhold(units)

    def _warn_about_dropped_writes(self, params, pids, versions):
        """Warns when the block wrote into one of `params` in place without a
        modifier_rank: the engine applies no such write (as DeepSpeed's GatheredParameters;
        FSDP's summon_full_params writes back)."""
        written = [self._records[pid].name if pid is not None else "(unregistered)"
                   for p, pid, version in zip(params, pids, versions) if p._version != version]
        if not written:
            return
        warnings.warn(
            f"zerort.torch: gathered() without modifier_rank: param \"{written[0]}\""
            + (f" and {len(written) - 1} more" if len(written) > 1 else "") + " written in "
            "the block on this rank; the engine applies no such write (at stage 3 it is gone "
            "when the block ends; below it, whether it lasts depends on the stage and dtype). "
            "To keep writes, pass modifier_rank=r: rank r's values become every rank's "
            "(DeepSpeed's GatheredParameters(modifier_rank=r); FSDP's summon_full_params "
            "writes back by default).", UserWarning, stacklevel=4)

    def _any_rank(self, flag):
        """Whether `flag` is true on any rank (collective)."""
        return bool(self.all_reduce(torch.tensor([float(flag)]), "max").item())

    def _entry_state(self, param, pid):
        """At a modifier block's entry: `param`'s fingerprint and whether a write of the
        trainer's is still to be taken into the engine (None for a param it does not drive)."""
        if pid is None:
            return None
        record = self._records[pid]
        pending = record.version is not None and param._version != record.version
        return _fingerprint(param), pending

    def _write_from(self, rank, params, pids, entered):
        """Rank `rank`'s values of `params` on every rank, in the model and the engine. A
        param is set where any rank finds it changed since the block's entry (`entered`) or
        holding a write still to be taken: one decision for every rank. The others are not
        set again, so their masters keep what the steps put below the param's precision."""
        for param in params:
            broadcast_tensor(param.data, self._comm, rank, self._timeout)
        changed = torch.tensor(
            [float(state is not None and (state[1] or _fingerprint(p) != state[0]))
             for p, state in zip(params, entered)] or [0.0])
        self.all_reduce(changed, "max")
        for param, pid, flag in zip(params, pids, changed.tolist()):
            if pid is None:
                continue
            if flag:
                self._set_from(param, self._records[pid])
            elif self._records[pid].version is not None:
                self._records[pid].version = param._version  # unchanged everywhere
