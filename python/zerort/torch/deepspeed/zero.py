"""deepspeed.zero's calls under their DeepSpeed names: GatheredParameters, Init and
register_external_parameter, over zerort.torch.gathered, init_context and
register_external_parameter."""
import contextlib

import torch

from ... import errors
from .._gathered import gathered, register_external_parameter
from .._init_context import init_context

__all__ = ["GatheredParameters", "Init", "register_external_parameter"]


def _gathered_parameters(params, modifier_rank=None, fwd_module=None, enabled=True):
    """deepspeed.zero.GatheredParameters: zerort.torch.gathered(params, modifier_rank), or
    nothing when not `enabled`; with `fwd_module`, the params are first registered as read
    by that module's forward (register_external_parameter), as DeepSpeed does."""
    if not enabled:
        return contextlib.nullcontext()
    if fwd_module is not None:
        for param in [params] if isinstance(params, torch.Tensor) else list(params):
            register_external_parameter(fwd_module, param)
    return gathered(params, modifier_rank)


def _zero_init(module=None, data_parallel_group=None, mem_efficient_linear=True,
               remote_device=None, pin_memory=False, config_dict_or_path=None, config=None,
               enabled=True, dtype=None, mpu=None, comm=None, **options):
    """deepspeed.zero.Init: modules built inside the block keep only this rank's slice of
    their float params (zerort.torch.init_context over `comm`, None: the launcher's ranks,
    as initialize's); nothing when not `enabled`. The params stay float32 until
    initialize() casts the slices to the config's bf16/fp16 (so `dtype` may only be None or
    float32), and the config is read there, not here. Converting a `module` built outside
    the block, `mpu`, `data_parallel_group`, `remote_device` offload and DeepSpeed's other
    options are named as unsupported."""
    del mem_efficient_linear, pin_memory, config_dict_or_path, config  # nothing to do here
    unsupported = {"module": module, "data_parallel_group": data_parallel_group,
                   "remote_device": None if remote_device in (None, "none") else remote_device,
                   "mpu": mpu, "dtype": None if dtype in (None, torch.float32) else dtype}
    unsupported.update({key: value for key, value in options.items() if value})
    for name, value in unsupported.items():
        if value is not None:
            raise errors.UnimplementedError(
                f"zerort.torch: deepspeed.zero.Init({name}=...) is not supported: build the "
                "model inside `with deepspeed.zero.Init():` (one data-parallel group, params "
                "on the device)", errors.UnimplementedError.status)
    if not enabled:
        return contextlib.nullcontext()
    return init_context(comm)


# DeepSpeed's names (a class in DeepSpeed, hence the capitals).
GatheredParameters = _gathered_parameters
Init = _zero_init
