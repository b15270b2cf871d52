"""ZeroRT as the optimizer backend of a PyTorch training loop.

    import zerort.torch
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": {"lr": 1e-3}}, comm)
    for batch in data:
        loss = model(batch)
        engine.backward(loss)    # or loss.backward(): gradients go to the engine as
                                 # autograd produces them
        engine.step()            # ends the micro-batch; steps every gradient_accumulation_steps

A DeepSpeed script switches by its import: `from zerort.torch import deepspeed` gives
deepspeed.initialize's signature and return value (engine, optimizer, loader, scheduler),
taking the script's own torch optimizer and scheduler callable (deepspeed/).

initialize() takes ZeroRT's config or DeepSpeed's (a dict, JSON text or a .json path) and,
as deepspeed.initialize, `model_parameters`: the params, or PyTorch-style param groups
({"params": [...], "lr": ..., "weight_decay": ...}) that become the engine's optimizer groups.
`engine.optimizer` is a torch.optim.Optimizer over those groups, so PyTorch's lr schedulers
drive it; a config "scheduler" (DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR) runs in
the engine and shows as `engine.lr_scheduler`.

What happens to the model:
- Every trainable param (`requires_grad=True`, each shared param once) is registered with the
  engine under its `named_parameters()` name, in that order, with its group's index. Frozen
  params (LoRA base weights, frozen embeddings) are never stepped: below stage 3 they stay
  the model's own; at stage 3 the float ones are registered frozen and sharded with their
  module's unit (so no rank holds the whole frozen base), and engine.state_dict() and
  close() give them back whole. Zero-element params (nn.Linear(8, 0)) are not registered:
  they train as no-ops, their `.grad` stays None after each step, and state_dict() returns
  them empty. Trainable sparse embeddings
  (sparse=True) are refused. One open engine drives a param: a second initialize() on the
  model is refused until the first engine's close().
- At stages 0-2 each trainable param's `.data` becomes a view of the engine's own copy
  (`zero_param_data`): the optimizer writes there, so nothing is copied back after a step.
  Rank 0's initial values of the trainable params reach every rank before the first
  forward (stage 3 refuses different values instead); rank 0's frozen params and buffers are
  copied to every rank when the engine is built, as DDP does (not again after: buffers that
  change in forward, such as BatchNorm statistics, stay per rank), once the ranks agreed on
  every one's name, shape and dtype (a difference is an error naming it, on every rank).
- What initialize() registered must stay: a param cast or moved (model.half(), .to()), a
  `.data` replaced by another tensor, a trainable param added or unfrozen after it, are
  errors naming the param (at the next step, forward or gradient; before anything of that
  param reaches the C ABI). Copy new values in place between steps, the same on every rank
  (param.copy_ under torch.no_grad(), or model.load_state_dict()): the engine takes them
  into what its step updates (a 16-bit param's fp32 master, a stage-3 persistent unit's
  shards) before the step's first forward or save_checkpoint() (the param's version counter
  moved). A write inside a micro-batch, or through `.data` (which moves no counter), is
  not taken; a write on some ranks only is a collective mismatch at the next iteration.
- close(), or the garbage collector when nobody called it, gives every param its own copy
  of its last value (stage 3: close() gathers them; the garbage collector cannot, so a
  sharded stage-3 param then reads as NaN). A tensor that still aliases the engine's memory
  (param.detach() taken before) keeps that memory alive, never reads freed memory.
- A hook after each param's gradient accumulation (`register_post_accumulate_grad_hook` on
  PyTorch >= 2.1, a post hook on the param's AccumulateGrad node before) hands the gradient to
  the engine (`zero_accumulate_grad`, `zero_accumulate_device_grad` for a CUDA gradient: one
  copy into the bucket) and sets `.grad` to None, so
  buckets reduce while the rest of backward runs (clipping is the config's clip_grad_norm /
  DeepSpeed's gradient_clipping, or engine.clip_grad_norm_; importing zerort.torch makes
  torch.nn.utils.clip_grad_norm_ over an engine's params call the latter: _torch_clip.py). A
  gradient the engine refused (a DuplicateGradientError, a KeyboardInterrupt inside the
  hook) is dropped from `.grad`, never added to a later step.
- guard.on_unused = "zero": params the graph of the model's outputs does not reach are
  marked ready as backward comes to them, as DDP's find_unused_parameters (_reach.py).
- Stage 3: one unit per module (and optimizer group) that owns trainable params, and one
  for its frozen ones, gathered before its forward and again before its backward, released
  after each (_stage3.py); between uses the unit's storage is freed, as FSDP does (the
  params read as NaN placeholders of their shape then). A module
  that uses another module's param (F.linear(h, self.embed.weight)) gathers it too, found as
  it reads it (_access.py) or declared with register_external_parameter(module, param); code
  outside forward reads or writes full values inside
  `with gathered(params, modifier_rank=None):` (_gathered.py). A leaf module
  (set_z3_leaf_modules(model, [MoEBlock]), as DeepSpeed's; _leaf_modules.py) is one unit
  with its whole subtree: a mixture of experts whose routing differs between ranks, or many
  small modules whose hooks would cost more than their kernels.
- Params on the CPU, or on one GPU (device "cuda", set from the model when the config names
  none): the engine's copies live in device memory and its work is ordered after torch's
  current stream at initialize(). Across processes use zerort.nccl_communicator() (under
  torchrun: zerort.nccl_communicator(bootstrap=torch_communicator(), stream=...)). In-process
  ranks sharing one GPU are for tests, at stages 0-2: PyTorch runs the CUDA part of every
  thread's backward on one autograd thread per device, so a rank that waits inside backward
  (a stage-3 gather, a full gradient-buffer pool) waits for peers queued behind it; stage 3
  is refused there, and stage 2 keeps a gradient buffer per bucket.

Modules: _engine.py (TorchEngine), _optimizer.py (engine.optimizer), _schedulers.py
(engine.lr_scheduler), _config.py (configs and param groups), _stage3.py, _device.py (the
device, the stream, rank 0's frozen state), _backward.py (which backward a duplicate gradient
came from; errors raised as a backward ends), _checkpoint.py (save_checkpoint and
load_checkpoint, client_state in checkpoints), _params.py (what was registered, and what
happens before the engine goes), _reach.py (guard.on_unused = "zero" marking unreached
params), _gathered.py (gathered() and register_external_parameter), _access.py (params read
in another module's forward, found), _init_context.py (init_context: a model built sharded),
_leaf_modules.py (leaf modules: stage-3 units of whole subtrees), _copies.py (copies of the
model carry none of the engine), _collective.py (which calls every rank must make;
all_reduce), _consolidated.py (the full state dict of a checkpoint, in one process),
_torch_distributed.py (torch.distributed's default group over ZeroRT's ranks),
_torch_communicator.py (ZeroRT's collectives over torch.distributed, under torchrun),
_full_state.py (safe_get_full_* and safe_set_full_*: a param's full fp32 state),
_torch_clip.py (torch.nn.utils.clip_grad_norm_ over an engine's params), deepspeed/
(deepspeed.initialize's signature, deepspeed.init_distributed, deepspeed.comm,
deepspeed.zero and deepspeed.utils).

Every failure is a zerort exception carrying the status and the library's message
(zerort.errors): DuplicateGradientError, UnusedParametersError, DeadlineExceededError, ...
"""
from ._engine import TorchEngine
from ._full_state import (safe_get_full_fp32_param, safe_get_full_grad,
                          safe_get_full_optimizer_state, safe_set_full_fp32_param,
                          safe_set_full_optimizer_state)
from ._gathered import gathered, register_external_parameter
from ._init_context import init_context
from ._leaf_modules import (get_z3_leaf_modules, set_z3_leaf_modules,
                            set_z3_leaf_modules_by_name, set_z3_leaf_modules_by_suffix,
                            unset_z3_leaf_modules, z3_leaf_module)
from ._optimizer import ZeroOptimizer
from ._schedulers import EngineLRScheduler
from ._torch_clip import install as _install_clip
from ._torch_communicator import default_communicator, torch_communicator
from ._torch_distributed import init_torch_distributed

_install_clip()  # torch.nn.utils.clip_grad_norm_ on an engine's params clips through it

__all__ = ["initialize", "TorchEngine", "ZeroOptimizer", "EngineLRScheduler", "gathered",
           "register_external_parameter", "init_context", "set_z3_leaf_modules",
           "unset_z3_leaf_modules", "get_z3_leaf_modules", "z3_leaf_module",
           "set_z3_leaf_modules_by_name", "set_z3_leaf_modules_by_suffix",
           "safe_get_full_fp32_param", "safe_get_full_optimizer_state", "safe_get_full_grad",
           "safe_set_full_fp32_param", "safe_set_full_optimizer_state",
           "init_torch_distributed", "torch_communicator"]


def initialize(model, config=None, comm=None, *, model_parameters=None):
    """Builds a TorchEngine for `model`, as deepspeed.initialize (which returns it with its
    optimizer and scheduler: here engine.optimizer and engine.lr_scheduler).

    `config`: ZeroRT's or DeepSpeed's config, a dict, JSON text or a path to a .json file
    (checked and translated by the library). `comm`: a zerort.core.Communicator
    (zerort.local_group(n)[r] for in-process ranks); None means the launcher's ranks: under
    torchrun (or another launcher that is not MPI's) torch.distributed's, as
    torch_communicator() makes it; otherwise this process's MPI rank (run under mpirun), as
    zerort.mpi_communicator() makes it, where an uncaught exception on one rank then ends
    the whole job. `model_parameters`: None (every trainable param, one group), an
    iterable of params, or a list of PyTorch param-group dicts with keys "params" and any of "lr",
    "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov" (group i overrides
    the config optimizer's values for its params); every trainable param of `model` must be
    in exactly one group.
    """
    if comm is None:
        comm = default_communicator(config)
    return TorchEngine(model, config, comm, model_parameters=model_parameters)
