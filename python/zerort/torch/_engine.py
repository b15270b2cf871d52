"""TorchEngine: one rank's ZeroRT engine driving a torch.nn.Module's trainable params."""
import math
import warnings
import weakref

import torch

from .. import core, errors
from . import (_backward, _checkpoint, _config, _device, _gathered, _handover, _init_context,
               _leaf_modules, _params, _reach, _stage3, _step_info)
from ._collective import all_reduce, every_rank_calls
from ._copies import EngineHook
from ._deepspeed_api import AccumulationSteps, DeepSpeedAPI, refuse_unless_default
from ._full_state import FullStateMethods
from ._optimizer import ZeroOptimizer
from ._schedulers import EngineLRScheduler

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class TorchEngine(DeepSpeedAPI, _checkpoint.CheckpointMethods, _gathered.GatheredMethods,
                  FullStateMethods):
    """One rank's engine driving `module`'s trainable params. Build it with initialize().

    The loop, as DeepSpeed's:

        loss = loss_fn(model(batch))
        engine.backward(loss)    # or loss.backward(): gradients go to the engine as
                                 # autograd makes them
        engine.step()            # ends the micro-batch; steps every gradient_accumulation_steps
        scheduler.step()         # a torch.optim.lr_scheduler on engine.optimizer, if any

    - `engine.optimizer`: a torch.optim.Optimizer whose param_groups are the engine's groups
      (_optimizer.py); PyTorch's lr schedulers work on it. `engine.lr_scheduler`: the config's
      built-in schedule (_schedulers.py), or a torch scheduler handed over with
      drive_lr_scheduler() (DeepSpeed's client scheduler, which step() steps), or None.
      `engine.get_lr()`: each group's lr for the next step.
    - Clipping is the config's `clip_grad_norm` (DeepSpeed's `gradient_clipping`), applied by
      the engine to the global norm over every rank's gradients. The hooks hand each gradient
      to the engine and clear `.grad`, so torch.nn.utils.clip_grad_norm_ on the model sees no
      gradient and returns 0.0; the norm of the last step is engine.get_global_grad_norm().
    - `engine.backward(loss)` multiplies the loss by the loss scale and divides it by
      gradient_accumulation_steps before backward; with `loss.backward()` do that yourself
      (engine.scale(loss) applies the loss scale; gradients that arrive under a loss scale
      nobody read are warned of once).
    - `engine.lend_gradients` (default: True on a GPU): where the engine would only copy a
      gradient into its bucket (a rank alone; on several ranks a param that fills its
      bucket, whose reduction then reads it), the hook lends autograd's tensor to the engine
      instead (core.Engine.lend_grad) and keeps it until the step. On
      the CPU the default is False: gradients all freed at the step come back as fresh pages
      in the next backward (the C allocator returns them), which costs about what the copy
      saves.
    - Every failure is a zerort exception carrying the library's message (zerort.errors).
    """

    def __init__(self, module, config, comm, model_parameters=None):
        self.module = module
        # Nothing is read before it is checked.
        self.config, raw = _config.load(config, comm.size)
        # Refusals first, so that a refused initialize() leaves the model as it was.
        _params.claim_check((n, p) for n, p in module.named_parameters() if p.requires_grad)
        _config.refuse_sparse_gradients(module)
        groups = _config.resolve_param_groups(module, model_parameters)
        device = _device.device_of(module, raw.get("device"))
        self._torch_device = device
        unmatched = _leaf_modules.apply_config(module, raw)  # stage 3's leaf modules
        if unmatched:
            warnings.warn(
                "zerort.torch: zero_optimization.leaf_module names what no module of the "
                f"model is: {', '.join(map(repr, unmatched))}; those are not leaves",
                stacklevel=3)
        _config.cast_to_precision(module, self.config, _init_context.cast)
        self.stage = _config.stage(self.config)
        self.gradient_accumulation_steps = AccumulationSteps(
            self.config.get("gradient_accumulation_steps", 1))
        self._loss_scale = _config.initial_loss_scale(self.config)
        # Whether this micro-batch read the loss scale (engine.backward and engine.scale do):
        # gradients of a loss nobody scaled are divided by it all the same (_end_micro_batch).
        self._loss_scale_read = False
        self._warned_unscaled = False
        self._warned_nan_norm = False
        self.global_steps = 0  # optimizer steps, skipped ones included (as DeepSpeed's)
        self.skipped_steps = 0  # of which the loss scaler skipped (DeepSpeed's)
        self._last_info = None
        self._step_applied = False  # was_step_applied(): the last step() stepped
        self.micro_steps = 0  # step() calls, as DeepSpeed's engine.micro_steps
        self._dropped_by_zero_grad = False  # optimizer.zero_grad() ended the micro-batch
        self._engine_steps = 0
        self.config = _config.with_param_groups(self.config, groups.overrides)
        self.config["device"] = device.type
        # The norm stays on the GPU after a step unless the config asks for it every step
        # (engine.step()'s info and get_global_grad_norm() read it when asked).
        self.config.setdefault("sync_grad_norm", False)
        # Where the engine leaves it (engine_step.cc): on a GPU, without loss scaling (whose
        # overflow flag the host reads anyway).
        self._norm_on_device = (
            device.type == "cuda" and not self.config["sync_grad_norm"]
            and self.config.get("loss_scale", {}).get("mode", "none") == "none")
        self._comm = comm
        guard = self.config.get("guard", {})
        self._timeout = float(guard.get("timeout_s", 600.0))
        self._stream = None  # device "cuda": the torch stream the engine's work follows
        if device.type == "cuda":
            self._stream = _device.prepare_cuda(self.config, self.stage, device, comm, raw)
        self._engine = core.Engine(self.config, comm)
        self._rank, self._world_size = self._engine.rank, self._engine.world_size
        # Before the engine's memory goes, however the engine is closed, even if the rest
        # of initialize() fails (_params.Detacher; it fills as the model is bound).
        self._hooks = []  # removable handles of the params' gradient hooks
        self._module_hooks = []
        self._detacher = _params.Detacher(self._engine._box)
        self._detacher.handles += [self._hooks, self._module_hooks]
        self._engine.on_close(self._detacher, weak=False)
        if self._stream is not None:
            self._engine.set_stream(self._stream.cuda_stream)
        _init_context.refuse_lost_writes(module, comm, self._timeout)
        sharded = [p for p in module.parameters() if _init_context.is_sharded(p)]
        if self.stage < 3:  # stages 0-2 keep the params whole on every rank
            with torch.no_grad():
                for param in sharded:
                    param.data = _init_context.materialize(param, comm, self._timeout)
        _device.sync_frozen_state(module, comm, self._timeout, _init_context.is_sharded)
        # Zero-element trainable params have nothing to reduce or step: not registered, no
        # hooks (trained as no-ops, as PyTorch does).
        self._inventory = _params.Inventory(module)
        self._empty = self._inventory.empty  # (name, param)
        for name, param in self._inventory.trainable:
            if param.dtype not in _DTYPES:
                raise errors.InvalidArgumentError(
                    f"zerort.torch: {name} has dtype {param.dtype}; ZeroRT keeps float32, "
                    "bfloat16 or float16 params")
        # Stage 3 shards the frozen float params too (a LoRA model's base), with their
        # modules' units; below it they stay the model's own, unless checkpoints are to hold
        # them (checkpoint.save_frozen: the engine keeps them, the model views its copy).
        save_frozen = bool(self.config.get("checkpoint", {}).get("save_frozen", False))
        frozen = self._inventory.frozen if self.stage == 3 or save_frozen else []
        unit_of, module_units = {}, {}
        if self.stage == 3:
            unit_of, module_units = _stage3.assign_units(
                module, {p for _, p in self._inventory.trainable}, groups.group_of,
                {p for _, p in frozen})
        self._params = []  # (name, param, id)
        self._names = {}  # id -> name
        self._records = self._inventory.records  # id -> _params.Registered
        for name, param in self._inventory.trainable:
            pid = self._engine.register_param(name, list(param.shape) or [1],  # 0-dim: [1]
                                              _DTYPES[param.dtype],
                                              group=groups.group(param),
                                              unit=unit_of.get(param, -1))
            self._params.append((name, param, pid))
            self._names[pid] = name
            self._records[pid] = _params.Registered(name, param, pid, unit_of.get(param))
            self._detacher.records.append(self._records[pid])
        self._frozen = []  # (name, param, id): the frozen params the engine keeps
        for name, param in frozen:
            pid = self._engine.register_param(name, list(param.shape) or [1],
                                              _DTYPES[param.dtype], requires_grad=False,
                                              unit=unit_of.get(param, -1))
            self._frozen.append((name, param, pid))
            self._records[pid] = _params.Registered(name, param, pid, unit_of.get(param))
            self._detacher.records.append(self._records[pid])
        if not self._params and not self._frozen:
            why = ("every param has requires_grad=False" if not self._empty else
                   "its trainable params hold no elements")
            if next(module.parameters(), None) is None:
                why = "it has no params at all"
            raise errors.InvalidArgumentError(
                "zerort.torch.initialize: the model has no param to train: " + why
                + " (a LoRA model whose adapters were not unfrozen, or a model frozen for "
                "evaluation). Set requires_grad=True on the params to train before "
                "initialize(); a model with nothing to train needs no engine (run it under "
                "torch.no_grad()).", errors.InvalidArgumentError.status)
        # A tied param's other names in the model's state dict (an output layer that is the
        # embedding): checkpoints record them, so a consolidated file holds every name.
        registered = {id(param): pid for _, param, pid in self._params + self._frozen}
        for name, tensor, is_param in _checkpoint.module_state_items(module):
            pid = registered.get(id(tensor)) if is_param else None
            if pid is not None and name != self._records[pid].name:
                self._engine.add_param_alias(pid, name)
        self._engine.finalize()
        for _, param, pid in self._params + self._frozen:
            sharded = _init_context.is_sharded(param)
            if sharded:  # whole one param at a time
                values = _init_context.materialize(param, comm, self._timeout)
            else:
                values = param.detach().contiguous()
            self._engine.set_param(pid, values.data_ptr())
            if sharded:  # a storage to find its gradient node by, of no size (_stage3 binds it)
                param.data = _params.placeholder(param)
        # Every rank computes with rank 0's values from here, whichever method of the model
        # runs first: its forward, or another (CLIP's encode_text). guard.init_params
        # "verify" compares at the first iteration instead (the trainer may still load the
        # same values on every rank); stage 3 compares at its first gather.
        init_params = self.config.get("guard", {}).get("init_params", "broadcast")
        if self.stage < 3 and init_params == "broadcast":
            self._engine.sync_replicas()
        self._accumulators = []  # AccumulateGrad nodes must outlive their hooks
        # Gradients the engine reads where they are (core.Engine.lend_grad), until a step
        # returns: one rank, where the copy into its bucket was all the engine did with them.
        self.lend_gradients = self._stream is not None
        self._lent_grads = []
        # Checked gradients not yet handed over: one library call for many (_handover.py).
        limit = _handover.elems_per_batch(self.config)
        grad_dtype = self.config.get("precision", {}).get("grad", "fp32")
        if (self.lend_gradients and self._engine.world_size == 1
                and self.gradient_accumulation_steps == 1
                and all(_DTYPES[p.dtype] in ("fp32", grad_dtype) for _, p, _ in self._params)):
            # One rank, every gradient lent (each in its gradient dtype, one micro-batch):
            # the reductions are identities (nothing to overlap) and the gradients live
            # until the step anyway, so one call per backward (stage 3: per unit).
            limit = float("inf")
        self._queue = _handover.GradQueue(self._engine, limit, self._stream is not None)
        for position, (_, param, pid) in enumerate(self._params):
            self._add_grad_hook(param, pid, unit_of.get(param), position)
        self._units = None
        self._passes = _backward.BackwardPasses()
        self._passes.on_end.append(self._flush_grads)  # first: the units' release follows
        if self.stage == 3:  # after the grad hooks: finding a param's node needs its storage
            self._units = _stage3.UnitGathering(self._engine, module,
                                                self._params + self._frozen,
                                                unit_of, module_units, self._records,
                                                self._passes)
            self._units.before_engine_call = self._flush_grads
            self._units.engine_stream = self._stream
            self._detacher.handles.append(self._units.handles)
            for sub, param in _gathered.declared_external(module):
                self.register_external_parameter(sub, param)
        else:
            self._bind_views()
        # The params whose writes are taken between steps (_take_written_params).
        self._versioned = [(param, self._records[pid]) for _, param, pid in
                           self._params + self._frozen if self._records[pid].version is not None]
        self._micro_batches = 0
        self._closed = False
        self._in_micro_batch = False
        # The window's last micro-batch was ended early to read its gradient (_full_state.py).
        self._window_ended = False
        self._handed_since_step_call = False  # gradients reached the engine since step()
        self._ran_forward = False  # the model's forward ran since the last micro-batch ended
        # ... with gradients enabled: its backward may still come (safe_set_full_* waits)
        self._graph_forward = False
        # guard.on_unused = "zero": params the graph of the model's outputs does not reach
        # are marked ready as backward comes to them (_reach.py).
        self._unused = None
        if guard.get("on_unused") == "zero":
            self._unused = _reach.UnusedMarking(self._params, self._mark_absent,
                                                lambda: self._passes.failed)
            if self._units is not None:
                self._units.mark_unreached_at_backward(self._unused)
        # The first micro-batch starts before the model's first forward: its BeginIteration
        # compares the replicas again (rank 0's values broadcast into the views at stages
        # 0-2), so a write into them since initialize() on rank 0 alone reaches every rank
        # before any computes with it. Later micro-batches start at their first gradient.
        # The hooks are EngineHooks: a copy of the model runs none of them (_copies.py).
        self._written = module.register_forward_pre_hook(
            EngineHook(lambda _m, _i: self._before_forward()))
        self._first_forward = module.register_forward_pre_hook(
            EngineHook(lambda _m, _i: self._start_first_micro_batch()))
        # A backward pass begins at the gradient of the model's output (_backward.py).
        self._output_hook = module.register_forward_hook(
            EngineHook(lambda _m, _i, output: self._hook_outputs(output)))
        self._module_hooks += [self._written, self._first_forward, self._output_hook]
        if self._stream is not None:
            # Params change on the engine's stream (the step, the gathers): a forward on
            # another stream waits for it first.
            self._module_hooks.append(module.register_forward_pre_hook(
                EngineHook(lambda _m, _i: self._follow_engine_stream())))
        self.optimizer = ZeroOptimizer(self, self.config, groups)
        self._config_schedule = (EngineLRScheduler(self, self.config)
                                 if _config.has_scheduler(self.config) else None)
        self.lr_scheduler = self._config_schedule
        # A scheduler the trainer handed over (drive_lr_scheduler), stepped after each
        # optimizer step, with step()'s lr_kwargs.
        self._driven_scheduler = None
        self._lr_kwargs = None
        # One open engine per param (a second initialize() is refused until close()).
        tracked = self._inventory.tracked.values()
        self._detacher.claimed = [weakref.ref(p) for p in tracked]
        _params.claim(tracked, self._engine._box)
        _gathered.drive(list(module.parameters()), self)  # frozen ones too (gathered())

    def _wait_for_current_stream(self):
        """Device "cuda": the engine's stream waits for the current one (work queued there
        on memory the engine reads or writes next)."""
        current = _device.other_current_stream(self._stream)
        if current is not None:
            self._stream.wait_stream(current)

    def _follow_engine_stream(self):
        """Device "cuda": the current stream waits for the engine's (its values)."""
        current = _device.other_current_stream(self._stream)
        if current is not None:
            current.wait_stream(self._stream)

    def _start_first_micro_batch(self):
        self._first_forward.remove()
        self._begin_micro_batch()

    def _before_forward(self):
        self._ran_forward = True
        self._graph_forward = self._graph_forward or torch.is_grad_enabled()
        if self._versioned and self._between_steps():
            self._take_written_params()

    def _between_steps(self):
        """Whether no micro-batch of the next optimizer step has begun (the engine is idle:
        SetParam's phase)."""
        return not self._in_micro_batch and self._micro_batches == 0 and not self._window_ended

    def _begin_micro_batch(self):
        if not self._in_micro_batch:
            if not self._ran_forward and self._versioned and self._between_steps():
                # A step's first gradient, and the model's forward did not run (another of
                # its methods computed: encode_text): the writes since the last step are
                # taken here, as the forward's pre-hook takes them.
                self._take_written_params()
            self._engine.begin_iteration()
            self._in_micro_batch = True

    def _hook_outputs(self, output):
        if self._units is not None:
            self._units.model_forward_ended()
        if not torch.is_grad_enabled():
            return
        tensors = [t for t in _stage3.tensors_in(output) if t.requires_grad]
        for tensor in tensors:
            tensor.register_hook(self._output_gradient)
        if self._unused is not None and tensors:
            self._unused.forward_ended(tensors)

    def _output_gradient(self, grad):
        self._passes.begin()
        return grad

    def _mark_absent(self, param, pid):
        """Marks the trainable param `pid` ready with no gradient (guard.on_unused = "zero",
        _reach.py); False when it was handed over already (or is frozen)."""
        self._flush_grads()  # a queued gradient has arrived too
        if pid not in self._names or self._passes.failed or (
                self._passes.first_pass(pid) is not None):
            return False
        self._begin_micro_batch()
        self._engine.grad_absent(pid)
        if self._units is not None:
            self._units.gradient_arrived(self._records[pid].unit, pid)
        return True

    @property
    def engine(self):
        """The underlying zerort.core.Engine (checkpoints, memory statistics)."""
        return self._engine

    @property
    def rank(self):
        """This rank's index (also after close())."""
        return self._rank

    @property
    def world_size(self):
        """The number of data-parallel ranks (also after close())."""
        return self._world_size

    def _bind_views(self):
        """Stages 0-2: every registered param's data becomes the engine's copy (a view that
        keeps the engine's memory alive, _params.Detacher)."""
        owner = self._engine.memory_owner
        with torch.no_grad():
            for _, param, pid in self._params + self._frozen:
                record = self._records[pid]
                address = self._engine.param_data(pid)
                param.data = _stage3.engine_view(address, record.shape, record.dtype,
                                                 record.device, owner)
                record.address = address
                # A 16-bit param's view is not what the step updates (its fp32 master is):
                # a write into it is taken between steps (_take_written_params).
                record.version = param._version if record.dtype != torch.float32 else None

    def _take_written_params(self):
        """Between steps (before the step's first forward, or a save): the values of params
        written in place since the last step (param.copy_(values) under torch.no_grad(),
        model.load_state_dict(): their version counter moved) go into the engine. The view
        (a 16-bit param at stages 0-2, a stage-3 persistent unit) holds them already, but the
        optimizer steps from the engine's own copy (the fp32 master, a unit's shards), which
        would write the old values back (an fp32 param's view at stages 0-2 is what the step
        updates: nothing to take). Every rank must write the same values (as
        load_state_dict on every rank does): a rank that sets a param compares the replicas
        at its next iteration. A write inside a micro-batch (a forward's own, such as
        nn.Embedding(max_norm=...)'s) is not taken, except where the model's forward did not
        run (another of its methods computed: the writes are taken at the step's first
        gradient then, the forward's own with them); nor is a write through .data, which
        moves no counter."""
        written = [(param, record) for param, record in self._versioned
                   if param._version != record.version]
        if written and self._stream is not None:
            self._follow_engine_stream()  # the step's writes, before the views are read
        for param, record in written:
            record.check(param, "taking the values written into a param")
            self._set_from(param, record)

    def _set_from(self, param, record):
        """The engine's copy of the param of `record` becomes `param`'s values (a copy of
        them: the view may be the engine's own memory); a tracked write is taken."""
        values = param.detach().clone()
        if self._stream is not None:
            self._wait_for_current_stream()  # the clone, queued there
        self._engine.set_param(record.pid, values.data_ptr())
        if record.version is not None:
            record.version = param._version

    def _forget_writes(self):
        """The views' version counters as they are now: writes made so far are not taken
        (those inside a micro-batch, and the step's own)."""
        for param, record in self._versioned:
            record.version = param._version

    def _add_grad_hook(self, param, pid, unit, position):
        """Hooks `param` (registered as `pid`, self._params[position], stage-3 `unit`)."""
        record = self._records[pid]
        ref, engine_ref = weakref.ref(param), weakref.ref(self)

        def drop_stale(_grad):
            # Before autograd adds this gradient into .grad: a .grad still there was never
            # handed over (a hook interrupted by an exception): it must not reach a step.
            held, engine = ref(), engine_ref()
            if held is None or engine is None:
                return
            if held.grad is not None:
                held.grad = None
            if not record.matches(held):
                # Cast after initialize (model.half()): PyTorch < 2.1 gives the param a new
                # AccumulateGrad node without the hand-over hook; say so as backward ends.
                engine._passes.begin()
                try:
                    record.check(held, "handing a gradient to the engine")
                except errors.ZeroError as error:
                    engine._passes.fail(error)

        def hand_over(held):
            # Holds neither the param nor the engine: on PyTorch >= 2.1 the param keeps this
            # hook, and a param the trainer keeps must not keep a dropped engine alive.
            engine = engine_ref()
            if held is None or engine is None or held.grad is None:
                return
            try:
                engine._passes.begin()
                if engine._passes.failed:  # an error is pending for this backward: drop the rest
                    return
                unused = engine._unused
                if unused is not None:
                    if pid in unused.marked:
                        raise _reach.late_gradient_error(record.name)
                    unused.sweep(position)
                    if engine._passes.failed:  # a hand-over in the sweep failed
                        return
                engine._hand_over(record, held.grad, unit)
            except errors.ZeroError as error:
                engine._passes.fail(error)  # raised when this backward ends (_backward.py)
            finally:
                held.grad = None  # handed over, or rejected: never kept for a later step

        self._hooks.append(param.register_hook(drop_stale))
        if hasattr(param, "register_post_accumulate_grad_hook"):
            self._hooks.append(param.register_post_accumulate_grad_hook(hand_over))
        else:  # PyTorch < 2.1: a post hook on the param's AccumulateGrad node, as DDP does
            accumulator = param.expand_as(param).grad_fn.next_functions[0][0]
            self._accumulators.append(accumulator)
            self._hooks.append(accumulator.register_hook(lambda *_: hand_over(ref())))

    def _hand_over(self, record, grad, unit):
        """Queues the gradient `grad` of the param of `record` (stage-3 `unit`) for the engine,
        checked first against what was registered: nothing else reaches the C ABI. The param
        itself was checked by its pre-hook (drop_stale)."""
        if grad.layout != torch.strided:
            raise errors.InvalidArgumentError(
                f"zerort.torch: param \"{record.name}\" got a {grad.layout} gradient; "
                "ZeroRT reduces dense gradients only (nn.Embedding(sparse=True) and "
                "nn.EmbeddingBag(sparse=True) produce sparse ones: use sparse=False)",
                errors.InvalidArgumentError.status)
        self._begin_micro_batch()
        if grad.requires_grad:  # backward(create_graph=True)
            grad = grad.detach()
        if grad.dtype != record.dtype or not grad.is_contiguous():
            grad = grad.to(record.dtype).contiguous()
        if tuple(grad.shape) != record.shape:
            raise errors.FailedPreconditionError(
                f"zerort.torch: param \"{record.name}\" got a gradient of shape "
                f"{tuple(grad.shape)}, not its registered {record.shape}",
                errors.FailedPreconditionError.status)
        if self._stream is not None:
            # Computed on another stream (a forward under torch.cuda.stream(s)): the engine's
            # stream waits for it. Whatever stream the gradient's memory came from (autograd
            # may store it from a stream it used before), the allocator keeps it until the
            # engine's copy or step has run on the engine's.
            self._wait_for_current_stream()
            grad.record_stream(self._stream)
        if (self._queue.add(record.pid, grad, unit) or not self._passes.open
                or (self._units is not None and self._units.queued(unit, record.pid))):
            self._flush_grads()

    def _flush_grads(self):
        """Hands the queued gradients to the engine (_handover.py): keeps the lent ones and
        records every arrival first, then lets stage 3 release the units they complete. An
        error waits for the end of the backward pass (raised at once outside one)."""
        if not self._queue.pids:  # before every stage-3 gather and release: mostly empty
            return
        handed, failure = self._queue.flush(self.lend_gradients)
        self._handed_since_step_call = True
        for item in handed:
            if item.kept:
                self._lent_grads.append(item.grad)  # read where it is until the step
            self._passes.arrived(item.pid)
        if isinstance(failure, errors.DuplicateGradientError):
            first = self._passes.first_pass(failure.pid)
            if first is not None and first < self._passes.current:
                failure = _backward.second_backward_error(
                    self._names[failure.pid], first, self._passes.current,
                    self.gradient_accumulation_steps)
        if self._units is not None:
            try:
                for item in handed:
                    self._units.gradient_arrived(item.tag, item.pid)
            except errors.ZeroError as error:
                failure = failure or error
        if failure is not None:
            self._passes.fail(self._model_change_behind(failure))

    def _model_change_behind(self, failure):
        """The error naming a change of the model since initialize() that explains
        `failure` (a module replaced: the old one's params never get a gradient, which at
        stage 3 exhausts the gradient buffers mid-backward), or `failure` itself."""
        if self.closed:  # the failure says what closed it
            return failure
        try:
            self._check_model("backward")
        except errors.FailedPreconditionError as changed:
            changed.__cause__ = failure
            return changed
        return failure

    @property
    def loss_scale(self):
        """The current loss scale (1.0 without loss scaling): the loss is multiplied by it
        before backward (engine.backward, engine.scale), and the step divides by it."""
        self._loss_scale_read = True
        return self._loss_scale

    @loss_scale.setter
    def loss_scale(self, value):
        if value == self._loss_scale:
            return
        raise errors.FailedPreconditionError(
            f"zerort.torch: engine.loss_scale is the engine's ({self._loss_scale:g}), which "
            f"divides the gradients by it at the step; setting it to {value} would scale the "
            "loss by one value and divide by another. Set the scale in the config: "
            "loss_scale.mode \"static\" with loss_scale.initial_power (DeepSpeed: "
            "fp16.loss_scale), or \"dynamic\", which grows it and backs off on overflow",
            errors.FailedPreconditionError.status)

    def _warn_about_a_nan_norm(self, norm):
        """Stage 3: warns once when a step applied a gradient whose norm is not finite,
        naming the cause that this stage adds: a param read in forward while its unit is
        released reads its placeholder, NaN."""
        if math.isfinite(norm) or self._warned_nan_norm:
            return
        self._warned_nan_norm = True
        warnings.warn(
            f"zerort.torch: step {self.global_steps} applied a gradient whose norm is "
            f"{norm}. At stage 3 a param read in forward by another way than through its "
            "own module (held in a Python list or a dict, a tensor kept from an earlier "
            "step) reads NaN while its unit is released: declare it with "
            "zerort.torch.register_external_parameter(module, param) for the module that "
            "reads it (DeepSpeed: deepspeed.zero.register_external_parameter). Without a "
            "loss scale a step applies what it is given, as PyTorch's optimizers do.",
            UserWarning, stacklevel=4)

    def _check_loss_was_scaled(self):
        """Warns once when a micro-batch's gradients arrived under a loss scale that nobody
        read (a static one: never read): a `loss.backward()` with loss scaling on, whose
        gradients the step divides by the scale all the same."""
        read = self._loss_scale_read
        if self.config.get("loss_scale", {}).get("mode") != "static":
            self._loss_scale_read = False  # a dynamic scale must be read for each loss
        if read or self._loss_scale == 1.0 or self._warned_unscaled:
            return
        self._warned_unscaled = True
        warnings.warn(
            f"zerort.torch: loss scaling is on (loss scale {self._loss_scale:g}) but this "
            "micro-batch's loss was not scaled: its backward went neither through "
            "engine.backward(loss) nor engine.scale(loss), and nothing read engine.loss_scale. "
            "The step divides the gradients by the loss scale all the same, so the params barely "
            "move. Call engine.backward(loss), or engine.scale(loss).backward().", stacklevel=4)

    def scale(self, loss):
        """`loss` times the current loss scale (1 unless loss_scale.mode is set)."""
        return loss * self.loss_scale

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        """DeepSpeed's engine.backward: backward of `loss` times the loss scale divided by
        gradient_accumulation_steps (so that a step's gradient is the mean over its
        micro-batches of each micro-batch's loss; `scale_wrt_gas` False: not divided).
        Returns `loss`."""
        factor = self.loss_scale / (self.gradient_accumulation_steps if scale_wrt_gas else 1)
        (loss * factor if factor != 1.0 else loss).backward(retain_graph=retain_graph)
        return loss

    def step(self, lr_kwargs=None):
        """Ends this micro-batch's backward; every gradient_accumulation_steps micro-batches,
        steps the optimizer (through engine.optimizer.step, with its param_groups' values)
        and returns a mapping {"step", "skipped", "grad_norm", "loss_scale"} (None in
        between; on a GPU "grad_norm" is read from the device when first asked for).
        `lr_kwargs`: DeepSpeed's arguments for the lr scheduler's step: passed to a driven
        one (drive_lr_scheduler); the config's schedule takes none; ignored without either,
        as DeepSpeed does (step a torch scheduler of your own yourself)."""
        if lr_kwargs and self._config_schedule is not None:
            refuse_unless_default("step", {"lr_kwargs": lr_kwargs}, {
                "lr_kwargs": (None, "the config's schedule takes no arguments; step a torch "
                                    "lr_scheduler on engine.optimizer yourself")})
        self._step_applied = False  # DeepSpeed's: also between optimizer steps
        boundary = self._end_micro_batch()
        self.micro_steps += 1
        if not boundary:
            return None
        self.optimizer._from_engine = True
        self._lr_kwargs = lr_kwargs
        try:
            self.optimizer.step()  # the attribute: lr schedulers wrap it to see steps
        finally:
            self.optimizer._from_engine = False
            self._lr_kwargs = None
        return self._last_info

    def drive_lr_scheduler(self, scheduler):
        """DeepSpeed's client lr_scheduler: `scheduler` (a torch scheduler built on
        engine.optimizer) becomes engine.lr_scheduler, stepped after each optimizer step the
        engine applies (not after one the loss scaler skipped; by engine.step() or
        engine.optimizer.step()), and saved and loaded with checkpoints. The trainer no
        longer steps it. Refused with the config's own schedule."""
        if self._config_schedule is not None:
            raise errors.InvalidArgumentError(
                "zerort.torch: the config's \"scheduler\" drives the lr already; drop it or "
                "the lr scheduler", errors.InvalidArgumentError.status)
        if getattr(scheduler, "optimizer", self.optimizer) is not self.optimizer:
            raise errors.InvalidArgumentError(
                "zerort.torch: the lr scheduler was built on another optimizer than "
                "engine.optimizer, whose groups drive the engine; build it on engine.optimizer",
                errors.InvalidArgumentError.status)
        self._driven_scheduler = self.lr_scheduler = scheduler

    def _end_micro_batch(self):
        """Ends the micro-batch; True when it is the last one before an optimizer step."""
        if self._window_ended:  # ended already, for safe_get_full_grad
            self._window_ended = False
            return True
        ran_forward, self._ran_forward = self._ran_forward, False
        self._graph_forward = False
        dropped, self._dropped_by_zero_grad = self._dropped_by_zero_grad, False
        self._flush_grads()  # gradients handed over outside a backward pass
        handed, self._handed_since_step_call = self._handed_since_step_call, False
        if handed:
            self._check_loss_was_scaled()
        arrived = self._in_micro_batch
        self._check_model("step()")
        self._before_the_engine_ends_micro_batch()
        try:
            self._engine.end_backward()
        except errors.UnusedParametersError as error:
            if self._passes.open:  # at step(): a backward of this micro-batch raised
                raise errors.UnusedParametersError(error.message + _backward.INTERRUPTED_HINT,
                                                   error.status) from None
            if not ran_forward and not arrived:
                raise _backward.step_without_backward_error(dropped) from None
            if not handed and self._passes.current == 0:  # no backward reached the outputs
                raise _backward.forward_without_backward_error() from None
            frozen = [name for name, param, _ in self._params if not param.requires_grad]
            hint = (_backward.frozen_after_initialize_hint(frozen) if frozen
                    else _backward.UNUSED_HINT)
            raise errors.UnusedParametersError(error.message + hint, error.status) from None
        except errors.InvalidArgumentError as error:
            if (self._units is None or " mismatch: " not in error.message or handed
                    or "group is broken" in error.message or self._passes.current != 0
                    or not ran_forward):
                raise
            raise type(error)(error.message + _backward.NO_BACKWARD_AT_STAGE3_HINT,
                              error.status) from None
        self._in_micro_batch = False
        self._forget_writes()
        self._passes.reset()
        self._micro_batches += 1
        if self._micro_batches < self.gradient_accumulation_steps:
            return False
        self._micro_batches = 0
        return True

    def _before_the_engine_ends_micro_batch(self):
        """What ending a micro-batch does here before the engine's call: zero-element params
        keep no .grad (they train as no-ops), stage-3 units are released, the micro-batch is
        begun in the engine when no gradient reached it (so that it says which are missing,
        or ends it with its peers), the reach tracker is told."""
        for _, param in self._empty:
            param.grad = None
        if self._units is not None:
            self._units.release_all()
        self._begin_micro_batch()
        if self._unused is not None:
            self._unused.micro_batch_ended()

    def _optimizer_step(self):
        """The optimizer step proper: param_groups' changes to the engine, step, the
        engine's lrs back (engine.optimizer.step calls it)."""
        try:
            self.optimizer.push()
        except Exception:
            # A value the engine refused (out of range) or could not read (None, a key
            # deleted): nothing stepped, and the window stays ended, so a step() after the
            # value is put right steps it, and zero_grad() drops it.
            self._window_ended = True
            raise
        # Counted before the step: one that fails has still replaced the norm on the device.
        # Never reset (global_steps is a checkpoint's after a load).
        self._engine_steps += 1
        try:
            info = self._engine.step()
        except errors.FailedPreconditionError:
            # Refused before it changed anything (the ranks' group settings differ, or an
            # iteration could no longer finish, which every later call says): the window
            # stays ended, so the next step() steps it and zero_grad() drops it.
            self._engine_steps -= 1
            self._window_ended = True
            raise
        except errors.AbortedError as error:
            if "loss scale already at its minimum" in error.message:
                # Skipped, as DeepSpeed's, which then ends the run: counted for a trainer
                # that catches it and goes on.
                self._lent_grads.clear()
                self.global_steps += 1
                self.skipped_steps += 1
                self._step_applied = False
                self._loss_scale = self._engine.loss_scale
            raise
        self._lent_grads.clear()
        self._loss_scale = info["loss_scale"]
        self.global_steps += 1
        self.skipped_steps += bool(info["skipped"])
        pending = self._norm_on_device and math.isnan(info["grad_norm"])
        info = _step_info.StepInfo(info, pending, self._engine_steps,
                                   self._engine.last_grad_norm, lambda: self._engine_steps)
        self._last_info = info
        self._step_applied = not info["skipped"]
        if self._units is not None and not pending and not info["skipped"]:
            self._warn_about_a_nan_norm(info["grad_norm"])
        if self._config_schedule is not None:  # only it moves a group inside a step
            self.optimizer.pull()
        if self._step_applied and self._driven_scheduler is not None:
            # As DeepSpeed's engine, after each step applied (not one the scaler skipped),
            # whether engine.step() or engine.optimizer.step() stepped.
            self._driven_scheduler.step(**(self._lr_kwargs or {}))
        return info

    def zero_grad(self, set_to_none=True):
        """engine.optimizer.zero_grad: drops the gradients of a backward no step() followed
        (and of the whole accumulation window, as PyTorch's zero_grad does); clears `.grad`."""
        self.optimizer.zero_grad(set_to_none)

    def _drop_unstepped_gradients(self):
        """optimizer.zero_grad(): when gradients reached the engine since the last step()
        call (a batch the trainer rejects after its backward, a GAN's generator pass through
        this discriminator), ends that micro-batch and drops every gradient the engine holds
        for the next optimizer step (core.Engine.drop_gradients; collective). Otherwise
        nothing: after step(), the engine already holds only the window's accumulation."""
        if self._passes.open:  # a backward that raised and was caught: never to end
            self._abandon_micro_batch()
        elif not self._handed_since_step_call and not self._window_ended:
            return
        else:
            self._end_micro_batch()
            self._engine.drop_gradients()
        self._micro_batches = 0
        self._lent_grads.clear()
        self._dropped_by_zero_grad = True  # a step() with nothing since is told why

    def _abandon_micro_batch(self):
        """optimizer.zero_grad() after a backward that raised (_backward.INTERRUPTED_HINT):
        the gradients it queued are never handed over, its pass and error are forgotten,
        and the engine ends the micro-batch with the missing gradients as zeros and drops
        the step's (core.Engine.abandon_micro_batch; collective: the peers skip the batch
        too, each with its own zero_grad())."""
        self._queue.clear()
        self._passes.abandon()
        self._handed_since_step_call = self._ran_forward = self._graph_forward = False
        if self._window_ended:  # the engine is between micro-batches: abandoning drops
            self._window_ended = False
        else:
            self._before_the_engine_ends_micro_batch()
        self._engine.abandon_micro_batch()
        self._in_micro_batch = False
        self._forget_writes()

    def all_reduce(self, tensor, op="sum"):
        """Reduces `tensor` over every rank of the engine's communicator, in place, and
        returns it (_collective.all_reduce: op "sum", "mean", "max" or "min"). Collective:
        every rank calls it with the same shape, outside backward (e.g. to average the loss
        for logging)."""
        return all_reduce(tensor, op, self._comm, self._timeout)

    @property
    def closed(self):
        """Whether the engine was closed."""
        return self._closed or self._engine.closed

    def _pid_of(self, param, what, module_params=False):
        """The engine id of `param`; with `module_params`, None for a param of the model
        the engine does not drive (frozen below stage 3 without checkpoint.save_frozen,
        zero-element, not float)."""
        for _, registered, pid in self._params + self._frozen:
            if registered is param:
                return pid
        if module_params and any(p is param for p in self.module.parameters()):
            return None
        raise errors.InvalidArgumentError(
            f"zerort.torch: {what}: a param of shape {tuple(param.shape)} that this engine "
            "does not drive (not a param of the model given to initialize(), or one with no "
            "elements, or a frozen one below stage 3 without checkpoint.save_frozen)",
            errors.InvalidArgumentError.status)

    def _check_model(self, what):
        """Raises FailedPreconditionError when the engine was closed, or naming the first
        param that changed since initialize() in a way the engine cannot follow
        (_params.Inventory.check)."""
        if self._engine.closed:
            raise errors.FailedPreconditionError(
                f"zerort.torch: {what}: this engine was closed (by close(), or by its "
                "communicator's close()); initialize() a new one to train on",
                errors.FailedPreconditionError.status)
        units = self._units
        self._inventory.check(self.module, self._params + self._frozen,
                              units.views_unit_memory if units is not None else None, what)

    def counters(self):
        """What the engine has done (a dict): reductions launched, stage-3 gathers prefetched
        and on demand (prefetching works when most are prefetched), trace departures
        (trace_invalidations), checkpoint bytes read, gradient bytes copied into the
        engine's buckets, and host waits (for a collective not yet complete, or the GPU)."""
        return self._engine.counters()

    def memory_stats(self):
        """Bytes this rank holds per category, {"params": (current, peak), "grads": ...,
        "optimizer", "comm", "gathered", "workspace"}."""
        return self._engine.memory_stats()

    def state_dict(self):
        """Full copies of every trainable param, by name, on the params' device
        (collective at stage 3; zero-element params included, empty), and of every frozen
        param the engine keeps (stage 3 shards them, and checkpoint.save_frozen keeps them
        at any stage): each param once. For a file model.load_state_dict() reads (tied
        names and buffers too), module_state_dict()."""
        self._check_model("state_dict()")
        result = {}
        with every_rank_calls("engine.state_dict()"):
            for name, param, pid in self._params + self._frozen:
                record = self._records[pid]
                full = torch.empty(record.shape, dtype=record.dtype, device=record.device)
                if self._stream is not None:
                    self._wait_for_current_stream()  # the memory's last use there
                self._engine.get_param(pid, full.data_ptr())
                result[name] = full
        for name, param in self._empty:
            result[name] = torch.empty(param.shape, dtype=param.dtype, device=param.device)
        return result

    def destroy(self):
        """DeepSpeed's name for close()."""
        self.close()

    def empty_partition_cache(self):
        """DeepSpeed's: frees every stage-3 unit left gathered, before an eval or generation
        pass that needs the memory or at the end of training: those this package still
        holds (a forward that raised, a module whose backward never came) and those the
        engine prefetched or kept for gathers still to come (an eval forward's prefetch of
        the backward that never came); on a GPU, PyTorch's cached blocks go back to the
        device too (torch.cuda.empty_cache(), as DeepSpeed's). The next forward gathers what
        it needs. Every rank calls it at the same point, between micro-batches and outside
        gathered() blocks (FailedPreconditionError otherwise); nothing to do below stage 3."""
        if self._units is None:
            return
        if self._in_micro_batch or self._passes.open or self._units.holding():
            raise errors.FailedPreconditionError(
                "zerort.torch: empty_partition_cache() inside a micro-batch or a gathered() "
                "block would release units in use; call it after step() (or before the next "
                "forward), outside gathered()", errors.FailedPreconditionError.status)
        self._units.release_all()
        with every_rank_calls("empty_partition_cache()"):
            self._engine.release_cached_units()
        if self._torch_device.type == "cuda":
            torch.cuda.empty_cache()

    def __getattr__(self, name):
        """As DeepSpeed's engine, a public attribute the engine does not have is the
        module's (engine.generate(...), a model's own methods and attributes); a method of
        the module that returns the module (engine.to(...), engine.half()) returns the
        engine, so `engine = engine.to(device)` keeps it."""
        module = self.__dict__.get("module")
        missing = AttributeError(f"{type(self).__name__!r} object (nor its module) has no "
                                 f"attribute {name!r}")
        if module is None or name.startswith("_") or not hasattr(module, name):
            raise missing
        value = getattr(module, name)
        if not callable(value) or isinstance(value, torch.nn.Module):
            return value

        def method(*args, **kwargs):
            result = value(*args, **kwargs)
            return self if result is module else result
        return method

    def close(self):
        """Frees the engine; the model keeps its params' last values (its own copies) and
        trains no more. Stage 3: collective (every rank calls it), as the full values are
        gathered. Closing twice does nothing. An engine that is never closed is freed by
        the garbage collector; the params then get their own copies as well, except a
        stage-3 param whose unit is sharded, which cannot be gathered there (see
        _params.Detacher): close() stage-3 engines."""
        if self._closed or self._engine.closed:
            return
        self._closed = True
        # Micro-batches ended by step() but not stepped: a rank that ran another number of
        # micro-batches than its peers steps other accumulation windows (stages 0-1 reduce
        # only at each window's end, so nothing else tells), and its last ones are left over
        # here. Gradients handed over with no step() since (a GAN's last generator pass
        # through this discriminator) are the trainer's choice and are not counted.
        unstepped = (int(self.gradient_accumulation_steps) if self._window_ended else
                     self._micro_batches)
        if unstepped:
            warnings.warn(
                f"zerort.torch: close(): the gradients of {unstepped} micro-batch(es) since the "
                f"last optimizer step (gradient_accumulation_steps = "
                f"{int(self.gradient_accumulation_steps)}) were never stepped and are dropped. "
                "Every rank must run the same number of micro-batches (a DistributedSampler "
                "with drop_last=True, or the same number of batches per rank), ending with a "
                "full window.", UserWarning, stacklevel=2)
        self._queue.clear()  # gradients of an unfinished backward: never handed over
        if self._stream is not None:
            self._follow_engine_stream()  # the params' copies (Detacher) read its last step
        try:
            if self._units is not None:
                self._units.remove()
        finally:
            self._engine.close()  # _params.Detacher runs
            self._lent_grads.clear()
