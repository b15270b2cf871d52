"""Where the engine runs and what every rank starts from: the params' device (the config's
"device" follows the model), the stream a GPU engine follows, and rank 0's frozen state on
every rank."""
import torch

from .. import errors


def device_of(module, named):
    """The one device of `module`'s trainable params, checked against the device the user's
    config names (`named`; None: the params decide, so a model on the GPU runs the engine on
    device "cuda")."""
    devices = ({p.device for p in module.parameters() if p.requires_grad}
               or {p.device for p in module.parameters()})
    if len(devices) > 1:
        raise errors.InvalidArgumentError(
            "zerort.torch: the trainable params are on several devices "
            f"({sorted(map(str, devices))}); one engine drives params on one device: move "
            "the model there first (model.to(device))")
    if not devices:  # no params at all: nothing to check
        return torch.device("cuda" if named == "cuda" else "cpu")
    device = devices.pop()
    named = named or device.type
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


def prepare_cuda(config, stage, device, comm, raw):
    """Device "cuda": returns the stream the engine follows (torch's current one), and sets
    in `config` what in-process ranks sharing the GPU need. PyTorch runs the CUDA part of
    every thread's backward on one autograd thread per device, so a rank must never wait
    inside backward for a peer: stage 3 (its gathers) is refused, and stage 2 holds a
    gradient buffer per bucket (buckets.pool_buffers, unless the user's config `raw` sets
    it)."""
    stream = torch.cuda.current_stream(device)
    if comm.stream is not None and comm.stream != stream.cuda_stream:
        raise errors.InvalidArgumentError(
            "zerort.torch: the NCCL communicator orders its collectives after stream "
            f"{comm.stream:#x}, but PyTorch's current stream is {stream.cuda_stream:#x}: "
            "create it with zerort.nccl_communicator(stream=torch.cuda.current_stream()"
            ".cuda_stream), or call initialize() on the stream it was given")
    if not comm.in_process or comm.size == 1:
        return stream
    if stage == 3:
        raise errors.UnimplementedError(
            "zerort.torch: stage 3 with the model on the GPU needs one process per rank "
            "(zerort.nccl_communicator() under mpirun), not in-process ranks: PyTorch runs "
            "every thread's CUDA backward on one autograd thread per device, so a rank "
            "gathering its params inside backward would wait for a peer queued behind it")
    if stage == 2:
        buckets = dict(config.get("buckets", {}))
        if "pool_buffers" not in raw.get("buckets", {}):
            buckets["pool_buffers"] = 2**31 - 1
        config["buckets"] = buckets
    return stream


def sync_frozen_state(module, comm, timeout):
    """Rank 0's frozen params (LoRA base weights, frozen embeddings) and buffers
    (BatchNorm statistics, masks) on every rank, as DDP does when it wraps a model: the
    engine owns only the trainable params, and a rank that loaded or seeded these
    differently would silently compute another model."""
    if comm.size == 1:
        return
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
