"""ZeroRT as the optimizer backend of a PyTorch training loop.

    import zerort.torch
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": {"lr": 1e-3}}, comm)
    for batch in data:
        loss = model(batch)
        loss.backward()          # gradients go to the engine as autograd produces them
        engine.step()            # ends the micro-batch; steps every gradient_accumulation_steps

What happens to the model:
- Every trainable param (`requires_grad=True`, each shared param once) is registered with the
  engine under its `named_parameters()` name, in that order; frozen params (LoRA base weights,
  frozen embeddings) are neither registered, sharded nor stepped.
- At stages 0-2 each trainable param's `.data` becomes a view of the engine's own copy
  (`zero_param_data`): the optimizer writes there, so nothing is copied back after a step.
  Rank 0's initial values of the trainable params reach every rank before the first
  forward (stage 3 refuses different values instead); rank 0's frozen params and buffers are
  copied to every rank when the engine is built, as DDP does (not again after: buffers that
  change in forward, such as BatchNorm statistics, stay per rank).
- A hook after each param's gradient accumulation (`register_post_accumulate_grad_hook` on
  PyTorch ≥ 2.1, a post hook on the param's AccumulateGrad node before) hands the gradient to
  the engine (`zero_accumulate_grad`: one copy into the bucket) and sets `.grad` to None, so
  buckets reduce while the rest of backward runs.
- Stage 3: one unit per module that owns trainable params, gathered before its forward and
  again before its backward, released after each (zerort/_stage3.py); between uses the
  params' storage is freed, as FSDP does.
- Params on the CPU, or on one GPU (device "cuda", set from the model when the config names
  none): the engine's copies live in device memory and its work is ordered after torch's
  current stream at initialize(). Across processes use zerort.nccl_communicator(). In-process
  ranks sharing one GPU are for tests, at stages 0-2: PyTorch runs the CUDA part of every
  thread's backward on one autograd thread per device, so a rank that waits inside backward
  (a stage-3 gather, a full gradient-buffer pool) waits for peers queued behind it; stage 3
  is refused there, and stage 2 keeps a gradient buffer per bucket.

Every failure is a zerort exception carrying the status and the library's message
(zerort.errors): DuplicateGradientError, UnusedParametersError, DeadlineExceededError, ...
"""
import contextlib
import json

import torch

from . import _stage3, core, errors

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

_UNUSED_HINT = (
    "\nIn PyTorch the usual cause is torch.utils.checkpoint.checkpoint(..., use_reentrant=True) "
    "around a block whose inputs do not require grad (frozen embeddings, the LoRA case): the "
    "reentrant implementation then computes no gradient for any param inside the block, "
    "silently. Fix: pass use_reentrant=False, or make the block's input require grad "
    "(x.requires_grad_()). Other causes: a branch of the model that did not run on this rank "
    "(set guard.on_unused = \"zero\"), or a param that is not used at all (freeze it).")


class TorchEngine:
    """One rank's engine driving `module`'s trainable params. Build it with initialize()."""

    def __init__(self, module, config, comm):
        self.module = module
        self.config = core.config_dict(config)
        self.stage = int(self.config.get("stage", 0))
        self.gradient_accumulation_steps = int(
            self.config.get("gradient_accumulation_steps", 1))
        scale = self.config.get("loss_scale", {})
        self.loss_scale = (2.0 ** scale.get("initial_power", 16)
                           if scale.get("mode", "none") != "none" else 1.0)
        device = _device_of(module, self.config)
        self._stream = None  # device "cuda": the torch stream the engine's work follows
        if device.type == "cuda":
            self._prepare_cuda(device, comm)
        self._engine = core.Engine(self.config, comm)
        if self._stream is not None:
            self._engine.set_stream(self._stream.cuda_stream)
        self._sync_frozen_state(module, comm)
        self._params = []  # (name, param, id)
        trainable = {p for p in module.parameters() if p.requires_grad}
        unit_of, module_units = {}, {}
        if self.stage == 3:
            unit_of, module_units = _stage3.assign_units(module, trainable)
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            if param.dtype not in _DTYPES:
                raise errors.InvalidArgumentError(
                    f"zerort.torch: {name} has dtype {param.dtype}; ZeroRT keeps float32, "
                    "bfloat16 or float16 params")
            pid = self._engine.register_param(name, list(param.shape) or [1],  # 0-dim: [1]
                                              _DTYPES[param.dtype],
                                              unit=unit_of.get(param, -1))
            self._params.append((name, param, pid))
        self._engine.finalize()
        for _, param, pid in self._params:
            values = param.detach().contiguous()
            self._engine.set_param(pid, values.data_ptr())
        self._hooks = []
        self._accumulators = []  # AccumulateGrad nodes must outlive their hooks
        for _, param, pid in self._params:
            self._add_grad_hook(param, pid, unit_of.get(param))
        self._units = None
        if self.stage == 3:  # after the grad hooks: finding a param's node needs its storage
            self._units = _stage3.UnitGathering(self._engine, module, self._params,
                                                unit_of, module_units)
        else:
            self._bind_views()
        self._micro_batches = 0
        self._closed = False
        self._engine.on_close(self._detach)
        self._in_micro_batch = False
        # The first micro-batch starts before the first forward: its BeginIteration makes the
        # replicas identical (rank 0's values broadcast into the views at stages 0-2), so
        # no rank computes with its own initial values. Later micro-batches start at their
        # first gradient.
        self._first_forward = module.register_forward_pre_hook(
            lambda _m, _i: self._start_first_micro_batch())

    def _prepare_cuda(self, device, comm):
        """Device "cuda": the config's device, the stream the engine follows (torch's current
        one), and what in-process ranks sharing the GPU need. PyTorch runs the CUDA part of
        every thread's backward on one autograd thread per device, so a rank must never wait
        inside backward for a peer: stage 3 (its gathers) is refused, and stage 2 holds a
        gradient buffer per bucket (buckets.pool_buffers, unless the config sets it)."""
        self.config["device"] = "cuda"
        self._stream = torch.cuda.current_stream(device)
        if comm.stream is not None and comm.stream != self._stream.cuda_stream:
            raise errors.InvalidArgumentError(
                "zerort.torch: the NCCL communicator orders its collectives after stream "
                f"{comm.stream:#x}, but PyTorch's current stream is "
                f"{self._stream.cuda_stream:#x}: "
                "create it with zerort.nccl_communicator(stream=torch.cuda.current_stream()"
                ".cuda_stream), or call initialize() on the stream it was given")
        if not comm.in_process or comm.size == 1:
            return
        if self.stage == 3:
            raise errors.UnimplementedError(
                "zerort.torch: stage 3 with the model on the GPU needs one process per rank "
                "(zerort.nccl_communicator() under mpirun), not in-process ranks: PyTorch runs "
                "every thread's CUDA backward on one autograd thread per device, so a rank "
                "gathering its params inside backward would wait for a peer queued behind it")
        if self.stage == 2:
            buckets = dict(self.config.get("buckets", {}))
            buckets.setdefault("pool_buffers", 2**31 - 1)
            self.config["buckets"] = buckets

    def _sync_frozen_state(self, module, comm):
        """Rank 0's frozen params (LoRA base weights, frozen embeddings) and buffers
        (BatchNorm statistics, masks) on every rank, as DDP does when it wraps a model: the
        engine owns only the trainable params, and a rank that loaded or seeded these
        differently would silently compute another model."""
        if comm.size == 1:
            return
        timeout = float(self.config.get("guard", {}).get("timeout_s", 600.0))
        frozen = [p for p in module.parameters() if not p.requires_grad]
        with torch.no_grad():
            for tensor in frozen + list(module.buffers()):
                if tensor.numel() == 0:
                    continue
                # NCCL takes device memory only; the other backends take host memory.
                values = tensor.detach().to(
                    "cuda" if comm.device_buffers_only else "cpu").contiguous()
                if values.is_cuda:
                    torch.cuda.current_stream(values.device).synchronize()
                comm.broadcast_bytes(values.data_ptr(),
                                     values.numel() * values.element_size(), 0, timeout)
                if values.data_ptr() != tensor.data_ptr():
                    tensor.copy_(values)

    def _start_first_micro_batch(self):
        self._first_forward.remove()
        if not self._in_micro_batch:
            self._engine.begin_iteration()
            self._in_micro_batch = True

    @property
    def engine(self):
        """The underlying zerort.core.Engine (checkpoints, memory statistics)."""
        return self._engine

    @property
    def rank(self):
        """This rank's index."""
        return self._engine.rank

    def _bind_views(self):
        """Stages 0-2: every trainable param's data becomes the engine's copy."""
        with torch.no_grad():
            for _, param, pid in self._params:
                param.data = _stage3.engine_view(self._engine.param_data(pid), param)

    def _add_grad_hook(self, param, pid, unit):
        def hand_over():
            grad = param.grad
            if grad is None:
                return
            if not self._in_micro_batch:
                self._engine.begin_iteration()
                self._in_micro_batch = True
            grad = grad.detach()
            if grad.dtype != param.dtype or not grad.is_contiguous():
                grad = grad.to(param.dtype).contiguous()
            if self._stream is not None:
                current = torch.cuda.current_stream(grad.device)
                if current != self._stream:
                    # Computed on another stream (a forward under torch.cuda.stream(s)): the
                    # engine's stream waits for it, and the allocator keeps the gradient's
                    # memory until the engine's copy has run there.
                    self._stream.wait_stream(current)
                    grad.record_stream(self._stream)
            self._engine.accumulate_grad(pid, grad.data_ptr())
            param.grad = None
            if self._units is not None:
                self._units.gradient_arrived(unit, pid)

        if hasattr(param, "register_post_accumulate_grad_hook"):
            self._hooks.append(
                param.register_post_accumulate_grad_hook(lambda _: hand_over()))
        else:  # PyTorch < 2.1: a post hook on the param's AccumulateGrad node, as DDP does
            accumulator = param.expand_as(param).grad_fn.next_functions[0][0]
            self._accumulators.append(accumulator)
            self._hooks.append(accumulator.register_hook(lambda *_: hand_over()))

    def scale(self, loss):
        """`loss` times the current loss scale (1 unless loss_scale.mode is set)."""
        return loss * self.loss_scale

    def step(self):
        """Ends this micro-batch's backward; every gradient_accumulation_steps micro-batches,
        steps the optimizer and returns {"step", "skipped", "grad_norm", "loss_scale"}
        (None in between)."""
        if self._units is not None:
            self._units.release_all()
        if not self._in_micro_batch:  # no gradient arrived: let the engine say which
            self._engine.begin_iteration()
            self._in_micro_batch = True
        try:
            self._engine.end_backward()
        except errors.UnusedParametersError as error:
            raise errors.UnusedParametersError(error.message + _UNUSED_HINT) from None
        self._in_micro_batch = False
        self._micro_batches += 1
        if self._micro_batches < self.gradient_accumulation_steps:
            return None
        self._micro_batches = 0
        info = self._engine.step()
        self.loss_scale = info["loss_scale"]
        return info

    def zero_grad(self, set_to_none=True):
        """Clears any `.grad` left on trainable params (the engine zeroes its own)."""
        del set_to_none  # always None: the engine holds the gradients
        for _, param, _ in self._params:
            param.grad = None

    @contextlib.contextmanager
    def no_sync(self):
        """DDP's no_sync, for loops written for it: the backward inside the block is one
        micro-batch of gradient accumulation, ended when the block exits (no step() call for
        it). The number of micro-batches per optimizer step is the config's
        gradient_accumulation_steps, so the last one of each step runs outside no_sync,
        followed by step(); no_sync around it raises FailedPreconditionError. Stages 0-1
        reduce once per step, as DDP; stages 2-3 reduce-scatter every micro-batch into the
        gradient shard (ZeRO-2's trade: no full-size gradient is kept between them). When the
        block raises, the micro-batch is not ended: the exception propagates, and the engine
        stays inside it (the next step() or no_sync exit ends it with what arrived)."""
        if self._micro_batches + 1 >= self.gradient_accumulation_steps:
            raise errors.FailedPreconditionError(
                f"no_sync(): this is micro-batch {self._micro_batches + 1} of "
                f"{self.gradient_accumulation_steps} (gradient_accumulation_steps), the one "
                "that steps the optimizer: run its backward outside no_sync and call step(), "
                "or set gradient_accumulation_steps to the number of micro-batches per step")
        yield
        self.step()

    def state_dict(self):
        """Full copies of every trainable param, by name, on the params' device
        (collective at stage 3)."""
        result = {}
        for name, param, pid in self._params:
            full = torch.empty(param.shape, dtype=param.dtype, device=param.device)
            self._engine.get_param(pid, full.data_ptr())
            result[name] = full
        return result

    def save_checkpoint(self, directory, tag=None, client_state=None):
        """Every rank saves its part; loadable at any world size and stage. With a `tag`
        (as DeepSpeed's save_checkpoint(save_dir, tag)): into directory/tag, then
        directory/latest names it and only the newest `checkpoint.keep_last` stay.
        `client_state` (a JSON-serialisable dict: data position, epoch, RNG seeds) is saved
        inside the same checkpoint, as DeepSpeed's client_state, so it can never disagree
        with it."""
        self._engine.set_checkpoint_user_data(json.dumps(client_state or {}))
        self._engine.save_checkpoint(directory, tag)

    def preemption_requested(self):
        """After zerort.install_preemption_handler(): whether any rank got SIGTERM or
        SIGUSR1. Collective (every rank calls it at the same step); the same answer on
        every rank, so all of them save and exit together."""
        return self._engine.preemption_requested()

    def load_checkpoint(self, directory):
        """Loads params and optimizer state (the model's params show the loaded values) from
        `directory`, or from the checkpoint directory/latest names; returns the
        client_state saved with it ({} if none)."""
        self._engine.load_checkpoint(directory)
        text = self._engine.checkpoint_user_data()
        if self._units is None:
            self._bind_views()
        return json.loads(text) if text else {}

    def _detach(self):
        """Before the engine's memory goes: hooks removed, params given their own copies
        (stage 3: only by close(), which gathers them; after the garbage collector freed
        the engine, a stage-3 model's trainable params have no storage)."""
        self._first_forward.remove()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._units is not None:
            return
        with torch.no_grad():
            for _, param, _ in self._params:
                param.data = param.data.clone()

    def close(self):
        """Frees the engine; the model keeps its params' last values and trains no more.
        Stage 3: collective (every rank calls it), as the full values are gathered.
        Closing twice does nothing."""
        if self._closed or self._engine.closed:
            return
        self._closed = True
        if self._units is not None:
            self._units.remove()
        self._engine.close()


def _device_of(module, config):
    """The one device of `module`'s trainable params, checked against the config's "device"
    (a model on the GPU sets it to "cuda" when the config does not name one)."""
    devices = ({p.device for p in module.parameters() if p.requires_grad}
               or {p.device for p in module.parameters()})
    if len(devices) > 1:
        raise errors.InvalidArgumentError(
            "zerort.torch: the trainable params are on several devices "
            f"({sorted(map(str, devices))}); one engine drives params on one device: move "
            "the model there first (model.to(device))")
    if not devices:  # no params at all: nothing to check
        return torch.device("cuda" if config.get("device") == "cuda" else "cpu")
    device = devices.pop()
    named = config.get("device", device.type)
    if named != device.type:
        raise errors.InvalidArgumentError(
            f"zerort.torch: the config's device is \"{named}\" but the params are on "
            f"{device}: move the model (model.to(\"{named}\")) or set \"device\": "
            f"\"{device.type}\"")
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        raise errors.InvalidArgumentError(
            f"zerort.torch: the params are on {device} but the current CUDA device is "
            f"cuda:{torch.cuda.current_device()}; the engine allocates on the current device: "
            f"call torch.cuda.set_device({device.index}) before initialize()")
    return device


def initialize(model, config=None, comm=None):
    """Builds a TorchEngine for `model` with `config` (a dict, a JSON string or a file path).

    `comm`: a zerort.core.Communicator (zerort.local_group(n)[r] for in-process ranks); None
    means this process's MPI rank (run under mpirun).
    """
    if comm is None:
        comm = core.mpi_communicator()
    return TorchEngine(model, config, comm)
