"""The parts of DeepSpeed's engine API a ported training script calls that are no more than
names for what TorchEngine already does: calling the engine runs the model, train()/eval(),
the rank attributes, the accumulation boundary and no_sync(), get_lr(), the step's queries
and counters, and DeepSpeed's keyword arguments of the checkpoint calls. TorchEngine
inherits them (DeepSpeedAPI)."""
import contextlib
import os

from .. import errors


class AccumulationSteps(int):
    """gradient_accumulation_steps as an int (range(engine.gradient_accumulation_steps)) that
    is also callable, as DeepSpeed's engine.gradient_accumulation_steps() is a method."""

    def __call__(self):
        return int(self)

    def __reduce__(self):
        return int, (int(self),)  # pickled (torch.save) as the plain int


def refuse_unless_default(call, given, defaults):
    """Raises UnimplementedError naming the first of DeepSpeed's keyword arguments `given`
    ({name: value}) that differs from its default in `defaults` ({name: (default, why)})."""
    for name, value in given.items():
        default, why = defaults[name]
        if value != default:
            raise errors.UnimplementedError(
                f"zerort.torch: {call}({name}={value!r}) is not supported: {why}",
                errors.UnimplementedError.status)


class DeepSpeedAPI:
    """DeepSpeed's names on TorchEngine (which sets module, config, stage, rank, world_size,
    gradient_accumulation_steps, optimizer, global_steps, _micro_batches, _window_ended,
    _last_info,
    _step_applied, _handed_since_step_call, _passes and _torch_device)."""

    def parameters(self, recurse=True):
        """The model's parameters(), as DeepSpeed's engine (a module wrapping it) gives."""
        return self.module.parameters(recurse)

    def named_parameters(self, prefix="", recurse=True):
        """The model's named_parameters()."""
        return self.module.named_parameters(prefix, recurse)

    @property
    def device(self):
        """DeepSpeed's engine.device: the torch.device the engine's params live on."""
        return self._torch_device

    def fp16_enabled(self):
        """DeepSpeed's: whether the params train in fp16 (the config's "fp16")."""
        return self.config.get("precision", {}).get("param") == "fp16"

    def bfloat16_enabled(self):
        """DeepSpeed's: whether the params train in bf16 (the config's "bf16")."""
        return self.config.get("precision", {}).get("param") == "bf16"

    def gradient_clipping(self):
        """DeepSpeed's: the global gradient norm clipped to (0.0: none)."""
        return float(self.config.get("clip_grad_norm", 0.0))

    def was_step_applied(self):
        """DeepSpeed's: whether the last engine.step() call stepped the optimizer and the
        step updated the params (False between accumulation boundaries, and when the loss
        scaler skipped the step on an overflow)."""
        return self._step_applied

    def get_lr(self):
        """Each group's learning rate for the next optimizer step."""
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def get_global_grad_norm(self):
        """The global gradient norm of the last optimizer step (over every rank, before
        clipping; None before the first step). On a GPU the first call after a step waits
        for the GPU to read it (see "sync_grad_norm")."""
        return None if self._last_info is None else self._last_info["grad_norm"]

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
        if self._window_ended or self._micro_batches + 1 >= self.gradient_accumulation_steps:
            raise errors.FailedPreconditionError(
                f"no_sync(): this is micro-batch {self._micro_batches + 1} of "
                f"{self.gradient_accumulation_steps} (gradient_accumulation_steps), the one "
                "that steps the optimizer: run its backward outside no_sync and call step(), "
                "or set gradient_accumulation_steps to the number of micro-batches per step")
        yield
        self.step()

    def __call__(self, *args, **kwargs):
        """DeepSpeed's engine(inputs): the model's forward."""
        return self.module(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """DeepSpeed's engine.forward(inputs): the model's forward."""
        return self.module(*args, **kwargs)

    def train(self, mode=True):
        """The model's train(mode); returns the engine, as DeepSpeed's does."""
        self.module.train(mode)
        return self

    def eval(self):
        """The model's eval(); returns the engine."""
        return self.train(False)

    @property
    def training(self):
        """The model's training flag (DeepSpeed's engine, a module, has its own)."""
        return self.module.training

    @property
    def global_rank(self):
        """DeepSpeed's global_rank: this rank's index."""
        return self.rank

    @property
    def local_rank(self):
        """DeepSpeed's local_rank: the launcher's LOCAL_RANK (Open MPI's
        OMPI_COMM_WORLD_LOCAL_RANK under mpirun), else the rank's index."""
        for name in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"):
            if name in os.environ:
                return int(os.environ[name])
        return self.rank

    def zero_optimization_stage(self):
        """DeepSpeed's zero_optimization_stage(): the ZeRO stage."""
        return self.stage

    def train_micro_batch_size_per_gpu(self):
        """DeepSpeed's: the micro-batch size per rank, the config's or, as DeepSpeed derives
        it, train_batch_size / (gradient_accumulation_steps × world size) (None when the
        config sets neither)."""
        batch = self.config.get("batch", {})
        if batch.get("micro_batch_size_per_rank"):
            return batch["micro_batch_size_per_rank"]
        ranks_steps = self.gradient_accumulation_steps * self.world_size
        train = batch.get("train_batch_size")
        return train // ranks_steps if train and train % ranks_steps == 0 else None

    def train_batch_size(self):
        """DeepSpeed's: the config's train_batch_size or, as DeepSpeed derives it, micro
        batch × gradient_accumulation_steps × world size (None when it sets neither)."""
        batch = self.config.get("batch", {})
        if batch.get("train_batch_size"):
            return batch["train_batch_size"]
        micro = batch.get("micro_batch_size_per_rank")
        return micro * self.gradient_accumulation_steps * self.world_size if micro else None

    def is_gradient_accumulation_boundary(self):
        """DeepSpeed's: whether the next step() steps the optimizer (it ends the last
        micro-batch of gradient_accumulation_steps, or safe_get_full_grad ended it)."""
        return self._window_ended or self._micro_batches + 1 >= self.gradient_accumulation_steps

    def set_gradient_accumulation_boundary(self, is_boundary):
        """DeepSpeed's. Accelerate (from 1.8) calls it before each micro-batch with its
        sync_gradients, then backward, and step() at boundaries only: a backward since the
        last step() call ends its micro-batch here, as step() would. ZeroRT steps every
        gradient_accumulation_steps micro-batches, so `is_boundary` must say what
        is_gradient_accumulation_boundary() then says; another answer is an
        UnimplementedError naming the way out."""
        if self._passes.current > 0 or self._handed_since_step_call:
            self.step()  # not a boundary (Accelerate calls step() there): ends the micro-batch
            self.micro_steps -= 1  # counts the script's step() calls, as DeepSpeed's
        if bool(is_boundary) == self.is_gradient_accumulation_boundary():
            return
        raise errors.UnimplementedError(
            f"zerort.torch: set_gradient_accumulation_boundary({bool(is_boundary)}) at "
            f"micro-batch {self._micro_batches + 1} of {self.gradient_accumulation_steps}: "
            "ZeroRT steps the optimizer every gradient_accumulation_steps micro-batches, not "
            "at boundaries chosen per micro-batch. With Accelerate: give it the config's "
            "gradient_accumulation_steps, and make each epoch's micro-batches a multiple of "
            "it (drop_last, or GradientAccumulationPlugin(sync_with_dataloader=False)), as "
            "it otherwise steps early at an epoch's end", errors.UnimplementedError.status)

    @property
    def dp_world_size(self):
        """DeepSpeed's: the number of data-parallel ranks."""
        return self.world_size

    @property
    def global_samples(self):
        """DeepSpeed's: samples stepped over, global_steps × train_batch_size() (None when
        the config gives no batch size)."""
        batch = self.train_batch_size()
        return None if batch is None else self.global_steps * batch

    def zero_optimization_partition_weights(self):
        """DeepSpeed's: whether the params are sharded (stage 3)."""
        return self.stage == 3

    def zero_gather_16bit_weights_on_model_save(self):
        """DeepSpeed's (Accelerate's get_state_dict asks it before
        _zero3_consolidated_16bit_state_dict): True, as module_state_dict() gathers full
        values at every stage (stage3_gather_16bit_weights_on_model_save is accepted and
        changes nothing)."""
        return True

    def get_mom(self):
        """DeepSpeed's: each param group's betas (Adam, AdamW, Lamb, Lion) or momentum
        (SGD), as engine.optimizer.param_groups hold them now."""
        return [group["betas"] if "betas" in group else group.get("momentum")
                for group in self.optimizer.param_groups]
