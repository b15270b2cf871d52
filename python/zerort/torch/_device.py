"""Where the engine runs and what every rank starts from: the params' device (the config's
"device" follows the model), the stream a GPU engine follows, and rank 0's frozen state on
every rank."""
import ctypes

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


# The current stream's cudaStream_t of a device, without building a torch.cuda.Stream
# (torch.cuda.current_stream costs tens of microseconds of host time; the gradient hooks ask
# once per param per backward). Absent from builds without CUDA.
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def other_current_stream(stream):
    """The current CUDA stream of `stream`'s device when it is not `stream`, else None (also
    when `stream` is None: no CUDA stream to follow)."""
    if stream is None:
        return None
    if _current_raw_stream is not None:
        if _current_raw_stream(stream.device.index) == stream.cuda_stream:
            return None
    current = torch.cuda.current_stream(stream.device)
    return current if current != stream else None


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


def broadcast_text(comm, text, root, timeout):
    """Rank `root`'s `text` on every rank (collective; the others' `text` is ignored)."""
    device = "cuda" if comm.device_buffers_only else "cpu"  # NCCL takes device memory
    data = text.encode()
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    comm.broadcast_bytes(length.data_ptr(), 8, root, timeout)
    size = int(length.item())
    if size == 0:
        return ""
    buffer = torch.zeros(size, dtype=torch.uint8)
    if comm.rank == root:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    buffer = buffer.to(device)
    if buffer.is_cuda:
        torch.cuda.current_stream(buffer.device).synchronize()
    comm.broadcast_bytes(buffer.data_ptr(), size, root, timeout)
    buffer = buffer.cpu()
    return ctypes.string_at(buffer.data_ptr(), size).decode()


_AGREE = -(2.0 ** 30)  # all_reduce_f32 "max" of this on every rank: no rank differs


def agree_on_frozen_state(named, comm, timeout):
    """Every rank checks its frozen params and buffers (`named`: [(name, tensor)]) against
    rank 0's names, shapes and dtypes before any is broadcast: a difference is an
    InvalidArgumentError on every rank naming the first differing tensor with its shape and
    dtype on rank 0 and on the lowest rank that differs (collective: rank 0's list, one
    all-reduce, and that rank's message when some rank differs)."""
    mine = [f"{name}: shape {tuple(t.shape)}, {t.dtype}" for name, t in named]
    theirs = [line for line in broadcast_text(comm, "\n".join(mine), 0, timeout).split("\n")
              if line]
    differs = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
    if differs is None and len(mine) != len(theirs):
        differs = min(len(mine), len(theirs))
    # max over ranks of -(rank + 1) picks the lowest rank that differs.
    flag = torch.tensor([_AGREE if differs is None else -(comm.rank + 1.0)],
                        dtype=torch.float32)
    comm.all_reduce_f32(flag.data_ptr(), 1, "max", timeout)
    if flag.item() == _AGREE:
        return
    first = int(-flag.item()) - 1
    message = ""
    if comm.rank == first:
        here = mine[differs] if differs < len(mine) else "no such tensor"
        there = theirs[differs] if differs < len(theirs) else "no such tensor"
        message = (f"frozen param or buffer #{differs} (the frozen params in "
                   "named_parameters() order, then named_buffers()) is "
                   f"\"{there}\" on rank 0 but \"{here}\" on rank {first}")
    message = broadcast_text(comm, message, first, timeout)
    raise errors.InvalidArgumentError(
        f"zerort.torch: the ranks' models differ: {message}. Every rank must build the "
        "same model (the same frozen params and buffers, of the same shapes and dtypes) "
        "before initialize(), which then copies rank 0's values to every rank.",
        errors.InvalidArgumentError.status)


def sync_frozen_state(module, comm, timeout, skip=lambda tensor: False):
    """Rank 0's frozen params (LoRA base weights, frozen embeddings) and buffers
    (BatchNorm statistics, masks) on every rank, as DDP does when it wraps a model: the
    engine steps only the trainable params (and at stage 3 shards the frozen ones from each
    rank's values), and a rank that loaded or seeded these differently would silently
    compute another model. The ranks first agree on every
    tensor's name, shape and dtype (agree_on_frozen_state)."""
    if comm.size == 1:
        return
    named = [(n, p) for n, p in module.named_parameters() if not p.requires_grad]
    named += list(module.named_buffers())
    agree_on_frozen_state(named, comm, timeout)
    for _, tensor in named:
        if not skip(tensor):  # (init_context's params came from rank 0 already)
            broadcast_tensor(tensor, comm, 0, timeout)


def broadcast_tensor(tensor, comm, root, timeout):
    """Rank `root`'s values of `tensor` into every rank's `tensor` (collective)."""
    if tensor.numel() == 0:
        return
    with torch.no_grad():
        # NCCL takes device memory only; the other backends take host memory.
        values = tensor.detach().to(
            "cuda" if comm.device_buffers_only else "cpu").contiguous()
        if values.is_cuda:
            torch.cuda.current_stream(values.device).synchronize()
        comm.broadcast_bytes(values.data_ptr(),
                             values.numel() * values.element_size(), root, timeout)
        if values.data_ptr() != tensor.data_ptr():
            tensor.copy_(values)
