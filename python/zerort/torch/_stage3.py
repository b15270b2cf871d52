"""Stage 3 for PyTorch modules: a unit per module, gathered around its forward and backward.

Each module that directly owns trainable params is one unit per optimizer group of those
params (a bucket holds params of one group; a param shared by several modules belongs to the
first; the others gather that unit too); a leaf module (_leaf_modules.py) owns every param
of its subtree, and the modules inside it are not hooked. Its frozen float params (a LoRA
model's base weights) are one more unit, sharded the same way and gathered with the others,
never reduced or stepped. A gathered unit's params are views of one flat storage laid out
as the engine's gathered unit (core.Engine.gathered_place). Between uses that storage is
resized to zero bytes, as FSDP does: the tensors autograd saved in forward refer to the
same storage, which is refilled before the module's backward. The engine gathers straight
into it: the storage is the memory the engine borrows for the unit
(core.Engine.lend_gathered_memory; lent when a gather or a prefetch starts, freed when the
engine gives it back), so a gather makes no copy, and on a GPU the memory comes from
PyTorch's caching allocator. While the memory is given back, each param's .data is a
placeholder of its shape (_params.placeholder: reads give NaN, in-place writes are refused)
rather than a view of no bytes, which PyTorch's kernels would read past (a crash, not an
error): p.norm(), model.half() or a copy between steps read NaN; gathered() reads the
values.

    forward pre-hook    gather the module's units (engine.gather), fill the storages
    forward hook        release them, unless gathered for backward; hook the outputs'
                        gradients. When an output needs a gradient the release is until
                        backward: the engine keeps a unit it would gather again within
                        stage3.max_reuse_elems (engine.release_until_backward). Outputs
                        are walked through tuples, lists, sets, dicts and dataclasses; an
                        output holding another kind of object, with no tensor seen to need a
                        gradient, keeps the units gathered until their gradients arrive
                        (frozen ones: until their inputs' gradient is computed)
    output grad hook    gather again, before the module's backward runs (a forward
                        recomputed inside backward by checkpointing gathers by itself);
                        under guard.on_unused = "zero", mark the units' params the
                        micro-batch's forward did not reach (_reach.py; a persistent
                        unit's module gets this hook alone)
    param grad hook     once every param of a unit has handed over its gradient, release
    input grad hook     a frozen unit gathered for backward: release once the gradient of
                        the module's inputs is computed (its backward has run) for every
                        call of it that had one pending (f(f(x)) waits for both)
    end of backward     release the frozen units still gathered for backward (a module
                        whose inputs need no gradient)
    step()              release what is still gathered, before end_backward

Units the engine keeps gathered (smaller than stage3.persistence_threshold) are views of the
engine's memory, as at stages 0-2, and none of this happens to them.

A module may gather units it does not own (add_units): those of params it uses but another
module owns, declared (register_external_parameter, _gathered.py) or found as it reads them
in its forward (_access.py). A unit held by a running forward or a gathered() block (hold)
is not released by a module nested inside it.

Limits: every rank must run the same modules in the same order (the gathers are
collective); a param read outside every forward finds its storage empty, or, while the
engine prefetches its unit (or keeps it gathered for a backward: one under way, or one that
never comes after a forward whose loss was dropped, until the step), values that may still
be arriving (gathered() is the way to read it there). Params must not be written in place
inside a forward or between a forward and its backward: where the engine keeps the unit for
the backward, the write reaches it (gathered(modifier_rank=r) is the way to write).
"""
import collections
import ctypes
import dataclasses
import functools
import weakref

import torch

from .. import errors
from ._access import innermost_running_module, runs_forward_hooks, watch
from ._collective import hinted
from ._copies import EngineHook
from ._device import other_current_stream
from ._leaf_modules import owners, z3_leaf_module
from ._params import placeholder, resize_storage, same_storage, storage_bytes


class _DeviceBytes:
    """`nbytes` bytes of device memory at `address`, as CUDA's array interface describes
    them (torch.as_tensor reads it; the tensor keeps this object, not the memory, alive)."""

    def __init__(self, address, nbytes, owner=None):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (address, False),
            "strides": None, "version": 2}
        self.owner = owner  # kept alive by the tensor, with this object


def engine_view(address, shape, dtype, device, owner=None):
    """A tensor of `shape` and `dtype` over engine memory at `address` on `device` (the
    tensor does not own it). `owner` (core.Engine.memory_owner) is kept alive by the tensor
    and by every tensor derived from it, so the engine's memory outlives them all."""
    numel = 1
    for size in shape:
        numel *= size
    nbytes = numel * (torch.finfo(dtype).bits // 8)  # float32, bfloat16, float16
    if torch.device(device).type == "cuda":
        raw = torch.as_tensor(_DeviceBytes(address, nbytes, owner), device=device)
        return raw.view(dtype).view(shape)
    buffer = (ctypes.c_byte * nbytes).from_address(address)
    buffer.owner = owner  # torch.frombuffer keeps the buffer object, so the owner, alive
    return torch.frombuffer(buffer, dtype=dtype, count=numel).view(shape)


# Values that hold no tensor.
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def tensors_in(value, unknown=None, seen=None):
    """The tensors in a module's output (a tensor, or tuples, lists, sets, dicts and
    dataclass instances of them). Any other object (which may hold tensors this walk cannot
    see) is appended to the list `unknown` when one is given."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    if isinstance(value, _PLAIN):
        return
    if seen is None:  # (a plain tensor output allocates nothing)
        seen = set()
    elif id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, (tuple, list, set, frozenset)):
        items = value
    elif isinstance(value, dict):
        items = value.values()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, field.name, None) for field in dataclasses.fields(value)]
    else:
        if unknown is not None:
            unknown.append(value)
        return
    for item in items:
        yield from tensors_in(item, unknown, seen)


def assign_units(module, trainable, group_of=None, frozen=()):
    """Unit ids for the params in `trainable` and `frozen` (sets of params): {param: unit},
    and the units each module needs, {module: [units]}, for modules that own such params
    (a leaf module owns every param of its subtree, _leaf_modules.py). A module's trainable
    params in different optimizer groups (`group_of`: {param: group}, 0 for a param it
    leaves out) form one unit per group, its frozen ones one more; units are numbered
    0..n-1 in order of first appearance."""
    group_of = group_of or {}
    unit_of, module_units, units_by_key = {}, {}, {}
    for sub, params in owners(module):
        units = []
        for param in params:
            if param not in trainable and param not in frozen:
                continue
            if param not in unit_of:
                key = (id(sub), "frozen" if param in frozen else group_of.get(param, 0))
                unit_of[param] = units_by_key.setdefault(key, len(units_by_key))
            units.append(unit_of[param])
        if units:
            module_units[sub] = sorted(set(units))
    return unit_of, module_units


_SAVE_WAYS = ("a file saved from it would not load. Use engine.module_state_dict() "
              "(collective: every rank calls it; the model's state dict with full values, "
              "loadable by model.load_state_dict()) or engine.save_16bit_model(dir), or "
              "engine.save_checkpoint() to resume; or read inside `with "
              "zerort.torch.gathered(params):`")
_LOAD_WAYS = ("load it with engine.load_module_state_dict(state_dict) (every rank calls it; one "
              "module gathered at a time, rank 0's values reach every rank), or inside `with "
              "zerort.torch.gathered(params, modifier_rank=0):`, or resume with "
              "engine.load_checkpoint()")


# What hinted() says of a failed gather or release.
_GATHERS = ("a stage-3 gather (each module's forward and backward)",
            "; evaluate on every rank (each rank its own batch), or read full values with "
            "engine.state_dict(). A generation loop makes as many forwards on every rank "
            "(Hugging Face's generate(..., synced_gpus=True) goes on until every rank is "
            "done). A rank whose loss does not depend on the model's outputs (no targets in "
            "its batch) runs no backward through the model: make it outputs.sum() * 0. A "
            "module that runs other submodules on each rank (a mixture of experts routing "
            "each rank's tokens to other experts) must gather them all at once: make it a "
            "leaf before initialize(), "
            "zerort.torch.set_z3_leaf_modules(model, [MoEBlockClass]). So must a module "
            "whose own params some ranks do not reach (guard.on_unused = \"zero\") while its "
            "backward gathers another unit (a frozen child, a module it calls: make that a "
            "child of the leaf): its bucket is completed at another point on each rank")


# Gathered memory an engine still held when it closed with its group broken: kept for good,
# as a collective that failed may still write into it.
_KEPT_AFTER_CLOSE = []


def _keep_lent(flats):
    """At the close of an engine whose group broke: keeps the flat storages that still have
    memory ({unit: flat})."""
    _KEPT_AFTER_CLOSE.extend(flat for flat in flats.values() if storage_bytes(flat) != 0)


class UnitGathering:
    """Installs the hooks above on `module` for `params` [(name, param, id)] registered
    with units `unit_of` (the frozen ones among them have no gradient to wait for);
    `records`: {id: _params.Registered}; `passes`: the engine's _backward.BackwardPasses
    (their ends release frozen units)."""

    def __init__(self, engine, module, params, unit_of, module_units, records, passes):
        self._engine = engine
        self._records = records
        # Called before each gather or release: the gradients queued so far go to the engine
        # first (_handover.py), so it sees every call in the order the hooks made them.
        self.before_engine_call = lambda: None
        self._unused = None  # mark_unreached_at_backward()
        self._members = {}  # unit -> [(param, id)]
        for _, param, pid in params:
            self._members.setdefault(unit_of[param], []).append((param, pid))
        self._member_ids = {unit: tuple(pid for _, pid in members)
                            for unit, members in self._members.items()}
        self._frozen = {unit for unit, members in self._members.items()
                        if not any(param.requires_grad for param, _ in members)}
        passes.on_end.append(self._after_backward_pass)
        self._gathered = set()
        # Units whose params were checked (check) since the last micro-batch ended (where
        # the engine checks every param) or a forward without autograd: a gather writes
        # only the unit's own storage.
        self._checked = set()
        self._for_backward = set()  # gathered by an output's gradient hook: kept until grads
        # Units whose last awaited param was marked absent as their module's backward began
        # (_before_backward): the engine releases them there, on every rank at the point where
        # it did before (its accounting, and so its prefetches, stay the same on every rank),
        # but their params keep viewing their storage until the backward pass ends: that
        # module's backward has not run yet and may read them (a param read detached, or
        # frozen since initialize()).
        self._marking = ()
        self._free_after_backward = set()
        self._lent = set()  # units whose flat storage the engine holds now (_lend, _give_back)
        # frozen unit -> forward calls (with grad) whose backward has not yet run
        self._backward_calls = collections.Counter()
        self._waiting = {}  # unit -> ids whose gradient has not arrived since the gather
        self._unqueued = {}  # unit -> those of them not queued either (_handover.py)
        self.handles = []
        # Persistent units answer param_data before any gather: bind them as views.
        self._persistent = set()
        with torch.no_grad():
            for unit, members in self._members.items():
                try:
                    addresses = [engine.param_data(pid) for _, pid in members]
                except errors.FailedPreconditionError:
                    continue
                self._persistent.add(unit)
                for (param, pid), address in zip(members, addresses):
                    param.data = self._view(pid, address)
                    records[pid].address = address
                    records[pid].version = param._version  # a write is taken (_engine.py)
        self._holds = collections.Counter()  # unit -> forwards and blocks using it now
        self._module_units = {}  # module -> the list of units its hooks gather
        # A module inside a leaf -> the outermost leaf around it, which gathers for it.
        self._enclosing_leaf = {}
        for leaf in module.modules():
            if z3_leaf_module(leaf):
                for sub in leaf.modules():
                    if sub is not leaf:
                        self._enclosing_leaf.setdefault(sub, leaf)
        self._persistent_users = {}  # module -> its persistent units (none of the hooks)
        for sub, units in module_units.items():
            self.add_units(sub, units)
            users = self._enclosing_leaf.get(sub, sub)
            for unit in units:
                if unit in self._persistent and unit not in self._persistent_users.get(users, ()):
                    self._persistent_users.setdefault(users, []).append(unit)
        # Params read in another module's forward: found as they are read (_access.py).
        self._model_modules = weakref.WeakSet(module.modules())
        # Until the model's first forward ends, every module without hooks gets one that does
        # nothing: PyTorch then runs the hooks a read adds to the module under way (it skips
        # them in a call that began without any), so the unit read there (a child's weight
        # read for its dtype) is released as that call ends, not held until the step.
        self._discovery = [sub.register_forward_hook(EngineHook(lambda *_: None))
                           for sub in module.modules()
                           if sub not in self._module_units and sub not in self._enclosing_leaf
                           and not runs_forward_hooks(sub)]
        self.handles.extend(self._discovery)  # removed at close, if no forward ran
        self._model = weakref.ref(module)
        self._unhold_after_forward = []  # units held for a read in a call without hooks
        sharded = [(param, unit) for unit, members in self._members.items()
                   if unit not in self._persistent for param, _ in members]
        self._unit_of_param = {id(param): unit for param, unit in sharded}
        # (a handle: the engine's close, or its communicator's, removes it with the hooks)
        self.handles.append(watch(module, [param for param, _ in sharded], self._read_released))
        # model.state_dict() and load_state_dict() between uses: an error naming the way,
        # not a file that cannot be loaded or a write into an empty storage.
        # (refuse_state_dict False: engine.module_state_dict() and load_module_state_dict(),
        # which replace them)
        self.refuse_state_dict = True
        self.handles.append(module._register_state_dict_hook(EngineHook(
            lambda _module, state_dict, prefix, _metadata: self._refuse_released_in(
                state_dict, prefix, "model.state_dict() holds", _SAVE_WAYS)
            if self.refuse_state_dict else None)))
        self.handles.append(module._register_load_state_dict_pre_hook(EngineHook(
            lambda *args: self._refuse_released_in(
                {name: self._param_named(name[len(args[1]):]) for name in args[0]
                 if name.startswith(args[1])}, "", "model.load_state_dict() would write",
                _LOAD_WAYS) if self.refuse_state_dict else None)))
        # Torch stream the engine's work follows (device "cuda"), set by the engine: memory
        # lent on another stream is kept for it until its work there is done.
        self.engine_stream = None
        self._flats = {}  # sharded unit -> its gathered memory, a flat byte tensor
        self._views = {}  # id of a sharded unit's param -> its view of the unit's flat
        self._placeholders = {}  # such an id -> its .data while the memory is given back
        self._placeholder_versions = {}  # such an id -> its version counter when it got it
        with torch.no_grad():
            for unit, members in self._members.items():
                if unit not in self._persistent:
                    self._flats[unit] = self._bind_flat(members)
        # The engine keeps these functions as long as its memory lives: they refer to this
        # object weakly (a dropped model is not kept alive by them).
        this = weakref.ref(self)
        engine.lend_gathered_memory(lambda unit, nbytes: this()._lend(unit, nbytes),
                                    lambda unit: this()._give_back(unit))
        engine.stop_lending_at_close(functools.partial(_keep_lent, self._flats))

    def _bind_flat(self, members):
        """Makes `members` [(param, id)] of one sharded unit views of a new flat byte tensor
        laid out as the engine's gathered unit; returns it with its storage freed."""
        places = [self._engine.gathered_place(pid) for _, pid in members]
        record = self._records[members[0][1]]
        flat = torch.empty(places[0][2], dtype=torch.uint8, device=record.device)
        for (param, pid), (_, offset, _, _) in zip(members, places):
            record = self._records[pid]
            nbytes = record.numel * param.element_size()
            self._views[pid] = flat[offset:offset + nbytes].view(record.dtype).view(record.shape)
            self._placeholders[pid] = placeholder(param)
            param.data = self._placeholders[pid]
            self._placeholder_versions[pid] = param._version
        resize_storage(flat, 0)
        return flat

    def _lend(self, unit, nbytes):
        """The engine's lend: `unit`'s flat storage, resized to `nbytes`; its address."""
        flat = self._flats[unit]
        if nbytes != flat.numel():
            raise errors.InternalError(
                f"zerort.torch: the engine asked for {nbytes} bytes for unit {unit}, whose "
                f"layout has {flat.numel()}", errors.InternalError.status)
        resize_storage(flat, nbytes)
        self._lent.add(unit)
        other = other_current_stream(self.engine_stream)
        if other is not None:
            # Memory freed on the current stream may still be read by work queued there: the
            # engine's writes wait for it; and it is not reused before the engine's work with
            # it is done.
            self.engine_stream.wait_stream(other)
            flat.record_stream(self.engine_stream)
        return flat.data_ptr()

    def _give_back(self, unit):
        """The engine's give_back: `unit`'s flat storage is freed and its params that view
        it get their placeholders, now or (_free_after_backward) when the backward pass
        ends."""
        self._lent.discard(unit)
        if unit not in self._free_after_backward:
            self._free_storage(unit)

    def _free_storage(self, unit):
        """`unit`'s params that view its flat storage get their placeholders; the storage is
        freed."""
        for param, pid in self._members[unit]:
            if param.data_ptr() == self._views[pid].data_ptr():
                param.data = self._placeholders[pid]
                self._placeholder_versions[pid] = param._version
        resize_storage(self._flats[unit], 0)

    def _param_named(self, name):
        """The model's param or buffer under its state-dict key `name` (None if none)."""
        path = name.split(".")
        owner = self._model()
        for part in path[:-1]:
            owner = getattr(owner, part, None)
        return getattr(owner, path[-1], None) if owner is not None else None

    def _refuse_released_in(self, tensors, prefix, what, ways):
        """Raises when a value of `tensors` ({state-dict key: tensor}) is a view of a sharded
        unit's storage between uses (compared by storage, so tied names count too): `what`
        it, and the `ways` to do it instead."""
        released = [self._flats[unit] for unit in self._flats if unit not in self._gathered]
        released += [self._placeholders[pid] for unit in self._flats if unit not in self._gathered
                     for _, pid in self._members[unit]]
        for name, value in tensors.items():
            if (name.startswith(prefix) and isinstance(value, torch.Tensor)
                    and any(same_storage(value, other) for other in released)):
                raise errors.FailedPreconditionError(
                    f"zerort.torch: {what} \"{name}\", a stage-3 param that is sharded and has "
                    f"no storage between uses (as in FSDP): {ways}.",
                    errors.FailedPreconditionError.status)

    def released_param_viewed_by(self, tensor):
        """The id of the sharded param whose placeholder `tensor` views (a param read
        between uses, e.g. param.detach()), or None."""
        for unit, members in self._members.items():
            if unit in self._flats and unit not in self._gathered:
                for _, pid in members:
                    if same_storage(tensor, self._placeholders[pid]):
                        return pid
        return None

    def views_unit_memory(self, pid, param):
        """Whether `param` (registered as `pid`, in a sharded unit) still views its unit's
        flat storage, or its placeholder: False once its .data was replaced by another
        tensor."""
        flat = self._flats[self._records[pid].unit]
        return same_storage(param, flat) or same_storage(param, self._placeholders[pid])

    def add_units(self, module, units):
        """Makes `module`'s forward (and backward) gather `units` as well: its own units, or
        those of params it uses but another module owns (register_external_parameter). A
        module inside a leaf: the outermost leaf around it gathers them."""
        units = [u for u in units if u not in self._persistent]
        if not units:
            return
        module = self._enclosing_leaf.get(module, module)  # nothing inside a leaf is hooked
        hooked = self._module_units.get(module)
        if hooked is not None:
            hooked.extend(u for u in units if u not in hooked)
            return
        hooked = self._module_units[module] = list(units)
        self.handles.append(module.register_forward_pre_hook(
            EngineHook(lambda _m, _i, units=hooked: self.hold(units))))
        self.handles.append(module.register_forward_hook(
            EngineHook(lambda _m, inputs, output, units=hooked: self._after_forward(
                units, inputs, output))))

    def mark_unreached_at_backward(self, unused):
        """guard.on_unused = "zero": the params of a module's units that this micro-batch's
        forward did not reach are marked by `unused` (_reach.UnusedMarking) as the module's
        backward begins, the persistent units' modules hooked for it too. Marked there, at
        the same point of every rank's backward: ranks may reach different params of a
        module (a mixture of experts, a branch per sample), and marking each as backward
        comes to it would complete its bucket at another point, before or after another
        collective, on each rank."""
        self._unused = unused
        for module, units in self._persistent_users.items():
            self.handles.append(module.register_forward_hook(EngineHook(
                lambda _m, _i, output, units=units: self._mark_at_backward(units, output))))

    def _mark_at_backward(self, units, output):
        """A persistent unit's module: its units' unreached params are marked as its
        backward begins (the gradient of an output)."""
        if not torch.is_grad_enabled():
            return
        members = [m for unit in units for m in self._members[unit]]
        needing_grad = [t for t in tensors_in(output) if t.requires_grad]
        if needing_grad:
            self._unused.at_backward(members)
        for tensor in needing_grad:
            tensor.register_hook(lambda grad: self._unused.mark(members))

    def _read_released(self, param):
        """A sharded param was read through its module: when its unit is released and a
        forward runs, the innermost running module gathers the unit now and around its
        forward and backward from now on, as if declared external."""
        unit = self._unit_of_param.get(id(param))
        if unit is None or unit in self._gathered or self._engine.closed:
            return
        module = innermost_running_module(lambda m: m in self._model_modules)
        if module is None:
            return
        module = self._enclosing_leaf.get(module, module)
        hooked = runs_forward_hooks(module)  # before add_units adds some
        self.add_units(module, [unit])
        self.hold([unit])
        # This call's forward hook ends the hold (add_units hooked it). A module PyTorch
        # called without hooks runs none: the hold lasts until the step (this step's backward
        # may need the unit), or, without autograd, until the model's forward ends.
        if not hooked and not torch.is_grad_enabled():
            self._unhold_after_forward.append(unit)

    def model_forward_ended(self):
        """The model's own forward returned: ends the holds of reads in calls without hooks
        made without autograd."""
        for handle in self._discovery:
            handle.remove()
        self._discovery = []
        units, self._unhold_after_forward = self._unhold_after_forward, []
        self.unhold(units)
        if not torch.is_grad_enabled():  # no step checks a forward-only pass: check anew
            self._checked.clear()

    def units_of(self, pids):
        """The sharded units of the params `pids` (sorted)."""
        return sorted({self._records[pid].unit for pid in pids} - self._persistent)

    def holding(self):
        """Whether a forward or a gathered() block holds some unit now."""
        return any(count > 0 for count in self._holds.values())

    def hold(self, units):
        """Gathers `units` and keeps them until unhold(): a module's forward, a gathered()
        block; a module nested inside does not release them when its own forward ends."""
        self._holds.update(units)
        self.gather(units)

    def unhold(self, units, until_backward=False):
        """Ends one hold of `units`; releases those no longer held, unless their backward
        needs them (`until_backward`: their backward follows, see release())."""
        for unit in units:
            self._holds[unit] = max(0, self._holds[unit] - 1)
        self.release([u for u in units
                      if self._holds[u] <= 0 and u not in self._for_backward], until_backward)

    def _view(self, pid, address):
        record = self._records[pid]
        return engine_view(address, record.shape, record.dtype, record.device,
                           self._engine.memory_owner)

    def is_gathered(self, unit):
        """Whether `unit` is gathered now (its params have storage)."""
        return unit in self._gathered

    def check(self, unit, what):
        """Raises when a param of a sharded `unit` changed since initialize() (another
        dtype or shape, or a .data replaced: no longer a view of the unit's memory), or was
        written in place between uses (said once: the write is lost either way)."""
        for param, pid in self._members[unit]:
            record = self._records[pid]
            record.check(param, what)
            if not self.views_unit_memory(pid, param):
                raise record.replaced_error(what)
            if (param._version != self._placeholder_versions[pid]
                    and same_storage(param, self._placeholders[pid])):
                self._placeholder_versions[pid] = param._version
                raise errors.FailedPreconditionError(
                    f"zerort.torch: {what}: param \"{record.name}\" was written in place "
                    "between uses (nn.init, copy_, fill_ ...), when a stage-3 param that is "
                    "sharded holds no values on this rank: the write reached a placeholder and "
                    "is lost. Write inside `with zerort.torch.gathered(params, "
                    "modifier_rank=0):` (every rank enters it; rank 0's values reach every "
                    "rank), or before initialize().", errors.FailedPreconditionError.status)

    def gather(self, units):
        """Makes `units` usable: the engine gathers them into their flat storages."""
        for unit in units:
            if unit in self._gathered:
                continue
            if unit not in self._checked:
                self.check(unit, "gathering a stage-3 unit")
                self._checked.add(unit)
            self.before_engine_call()
            try:
                self._engine.gather(unit)
            except errors.ZeroError as error:
                raise hinted(error, *_GATHERS) from error.__cause__
            for param, pid in self._members[unit]:
                param.data = self._views[pid]
            other = other_current_stream(self.engine_stream)
            if other is not None:  # read there, after the gather: not reused before
                other.wait_stream(self.engine_stream)
                self._flats[unit].record_stream(other)
            self._gathered.add(unit)
            if unit not in self._frozen:
                self._waiting[unit] = set(self._member_ids[unit])
                self._unqueued[unit] = set(self._member_ids[unit])

    def release(self, units, until_backward=False):
        """Frees `units` (the engine gives their storages back), but not one a forward or a
        gathered() block holds. `until_backward`: the end of a forward whose backward
        follows; the engine keeps a unit gathered when its recorded order gathers it again
        within stage3.max_reuse_elems (core.Engine.release_until_backward)."""
        release = (self._engine.release_until_backward if until_backward
                   else self._engine.release)
        for unit in units:
            if unit not in self._gathered or self._holds[unit] > 0:
                continue
            self.before_engine_call()
            try:
                release(unit)
            except errors.ZeroError as error:  # a gather's failure may show here
                raise hinted(error, *_GATHERS) from error.__cause__
            self._gathered.discard(unit)
            self._for_backward.discard(unit)

    def release_all(self):
        """Frees every unit still gathered (the step: holds end too)."""
        self._holds.clear()
        self._checked.clear()
        self.release(sorted(self._gathered))
        self._free_storages_kept_for_backward()

    def queued(self, unit, pid):
        """`pid`'s gradient is queued for the engine (_handover.py): whether its gathered
        `unit` now waits for no other (handing them over releases the unit)."""
        unqueued = self._unqueued.get(unit)
        if unqueued is None or unit in self._persistent:
            return False
        unqueued.discard(pid)
        return not unqueued

    def gradient_arrived(self, unit, pid):
        """A param's gradient was handed over: releases its unit once all have been."""
        if unit in self._persistent:
            return
        waiting = self._waiting.get(unit)
        if waiting is None:
            return
        waiting.discard(pid)
        self._unqueued[unit].discard(pid)  # marked absent: never queued
        if waiting:
            return
        if unit in self._marking:
            self._free_after_backward.add(unit)
        self.release([unit])

    def _after_forward(self, units, inputs, output):
        if not torch.is_grad_enabled():
            self.unhold(units)
            return
        # Units with no param that trains now (frozen at initialize() or since): their
        # backward computes only the inputs' gradient.
        frozen = [u for u in units if u in self._frozen or not self._trains_now(u)]
        needing = [t for t in tensors_in(inputs) if t.requires_grad] if frozen else []
        unknown = []
        needing_grad = [t for t in tensors_in(output, unknown) if t.requires_grad]
        if unknown and not needing_grad:
            # The output holds objects this walk does not know, which may hold tensors whose
            # backward would find the params empty: units that train stay gathered until
            # their gradients arrive (or the step), the others, when the inputs need a
            # gradient, until it is computed (below).
            self._for_backward.update(u for u in units if u not in frozen)
            if needing:
                self._for_backward.update(frozen)
        self.unhold(units, until_backward=bool(needing_grad))
        if needing_grad and self._unused is not None:
            self._unused.at_backward([m for unit in units for m in self._members[unit]])
        for tensor in needing_grad:
            tensor.register_hook(lambda grad, units=units: self._before_backward(units, grad))
        if needing:
            # One more call whose backward needs these units: released when no such call is
            # left (f(f(x)): the second call's input hook fires before the first's backward).
            self._backward_calls.update(frozen)
            done = {"fired": False}
            for tensor in needing:
                tensor.register_hook(lambda grad, frozen=frozen, done=done: self._after_backward(
                    frozen, done, grad))

    def _trains_now(self, unit):
        """Whether some param of `unit` requires a gradient now (not frozen since)."""
        for param, _ in self._members[unit]:
            if param.requires_grad:
                return True
        return False

    def _before_backward(self, units, grad):
        self.gather(units)
        self._for_backward.update(units)
        if self._unused is not None:  # every rank is here now, whatever it reached
            self._marking = units
            try:
                self._unused.mark([m for unit in units for m in self._members[unit]])
            finally:
                self._marking = ()
        return grad

    def _after_backward(self, frozen, done, grad):
        """The gradient of a module call's input is computed: that call's backward no longer
        needs its frozen units (once per call, whichever input's hook fires first)."""
        if not done["fired"]:
            done["fired"] = True
            for unit in frozen:
                self._backward_calls[unit] = max(0, self._backward_calls[unit] - 1)
            self.release([u for u in frozen
                          if u in self._for_backward and self._backward_calls[u] == 0])
        return grad

    def _after_backward_pass(self):
        self._backward_calls.clear()
        self.release(sorted(u for u in self._for_backward if u in self._frozen))
        self._free_storages_kept_for_backward()

    def _free_storages_kept_for_backward(self):
        """Frees the storages _give_back kept for a backward that has now run. Those the
        engine has lent again since (a gather, a prefetch) are in use: their next give_back
        frees them."""
        kept, self._free_after_backward = self._free_after_backward, set()
        for unit in kept:
            if unit not in self._lent:
                self._free_storage(unit)

    def remove(self):
        """Removes the module hooks; gives every param its full value back in its storage
        (collective: every param is gathered, in the same order on every rank). A param
        changed since initialize() (_params) keeps what it was given."""
        for handle in self.handles:
            handle.remove()
        del self.handles[:]
        self.release_all()
        with torch.no_grad():
            for unit, members in self._members.items():
                for param, pid in members:
                    record = self._records[pid]
                    if unit in self._persistent:
                        if param.data_ptr() == record.address:
                            param.data = param.data.clone()
                        continue
                    values = torch.empty(record.shape, dtype=record.dtype, device=record.device)
                    other = other_current_stream(self.engine_stream)
                    if other is not None:  # the memory's last use there comes first
                        self.engine_stream.wait_stream(other)
                    self._engine.get_param(pid, values.data_ptr())  # every rank calls
                    if record.matches(param) and self.views_unit_memory(pid, param):
                        param.data = values
