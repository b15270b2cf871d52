"""ZeroRT's collectives over torch.distributed, so that a script launched by torchrun (or the
deepspeed launcher, or accelerate launch) trains without MPI:

    torchrun --nproc_per_node 4 train.py     # initialize(model, config) finds the ranks

torch_communicator() joins torch.distributed's default process group (initialising it from
torchrun's environment when the script has not) and creates two gloo groups over its ranks,
one per channel of ZeroRT's external communicator: gradients and params on one, values and
the cross-rank checks of tagged collectives on the other. The collectives run on host memory
(gloo); sums of bf16 and fp16 are taken in fp32 and rounded once, as ZeroRT's own
communicators do, and reduce-scatter is an all-reduce of which each rank keeps its chunk
(gloo has no reduce-scatter on every PyTorch 2.x, nor on 1.x). With the model on a GPU the
engine's buffers are copied through host memory; for NCCL, pass
comm=zerort.nccl_communicator(bootstrap=torch_communicator(), stream=...) instead.
"""
import ctypes
import datetime
import os
import threading

import torch

from .. import core, errors
from . import _config

# zero_collective's kinds, element types and reductions (include/zero/zero.h).
_REDUCE_SCATTER, _ALL_GATHER, _ALL_REDUCE, _BROADCAST, _BARRIER = range(5)
_DTYPES = {0: torch.float32, 1: torch.bfloat16, 2: torch.float16, 3: torch.int64,
           4: torch.uint8}
_SIXTEEN_BIT = (torch.bfloat16, torch.float16)


def _host_tensor(address, count, dtype):
    """The `count` elements of `dtype` at host `address` as a tensor sharing that memory."""
    if count == 0 or not address:
        return torch.empty(0, dtype=dtype)
    size = count * torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer((ctypes.c_char * size).from_address(address), dtype=dtype)


class _TorchCollectives:
    """The table ZeroRT's external communicator runs: each collective on its channel's gloo
    group, asynchronously, on tensors torch owns; `wait` copies the result into ZeroRT's
    buffer (the chunk a reduce-scatter keeps, a 16-bit result rounded back). `destroy`
    destroys the two groups once the communicator is gone."""

    def __init__(self, channels):
        self._channels = channels
        self._lock = threading.Lock()
        self._works = {}  # handle -> (torch Work, what to do once it completed or None)
        # Works released before they completed (given up after a timeout): kept until they
        # complete, so that the last reference to one goes here, with the GIL, and never in
        # gloo's worker thread (which cannot take the GIL at exit, and aborted the process).
        self._unfinished = []
        self._next = 0

    def start(self, c):
        group = self._channels[c.channel]
        if c.kind == _BARRIER:
            work = torch.distributed.all_reduce(torch.zeros(1), group=group, async_op=True)
            finish = None
        elif c.kind in (_ALL_GATHER, _BROADCAST):
            work, finish = self._move_bytes(c, group)
        else:
            work, finish = self._reduce(c, group)
        with self._lock:
            handle = self._next
            self._next += 1
            self._works[handle] = (work, finish)
        return handle

    @staticmethod
    def _move_bytes(c, group):
        """An all-gather or broadcast: bytes of any element type, as uint8. gloo gets tensors
        torch owns: its worker thread may free the last reference to one, which for a view of
        foreign memory needs the GIL (fatal at exit)."""
        dist = torch.distributed
        world = dist.get_world_size(group)
        size = torch.empty(0, dtype=_DTYPES[c.dtype]).element_size()
        gather = c.kind == _ALL_GATHER
        recv = _host_tensor(c.recv, c.count * size * (world if gather else 1), torch.uint8)
        if gather:
            owned = torch.empty_like(recv)
            send = _host_tensor(c.send, c.count * size, torch.uint8).clone()
            work = dist.all_gather(list(owned.chunk(world)) if world > 1 else [owned], send,
                                   group=group, async_op=True)
        else:
            owned = recv.clone()
            work = dist.broadcast(owned, c.root, group=group, async_op=True)
        return work, lambda: recv.copy_(owned)

    @staticmethod
    def _reduce(c, group):
        """An all-reduce, or a reduce-scatter as an all-reduce of which this rank keeps its
        chunk; 16-bit values summed in fp32 and rounded once."""
        dist = torch.distributed
        dtype = _DTYPES[c.dtype]
        scattered = c.kind == _REDUCE_SCATTER
        send = _host_tensor(c.send, c.count * (dist.get_world_size(group) if scattered else 1),
                            dtype)
        recv = _host_tensor(c.recv, c.count, dtype)
        total = send.to(torch.float32) if dtype in _SIXTEEN_BIT else send.clone()
        op = dist.ReduceOp.MAX if c.op == 1 else dist.ReduceOp.SUM
        work = dist.all_reduce(total, op=op, group=group, async_op=True)
        rank = dist.get_rank(group)
        mine = total[rank * c.count:(rank + 1) * c.count] if scattered else total
        return work, lambda: recv.copy_(mine)

    def wait(self, handle, timeout_s):
        with self._lock:
            work, finish = self._works[handle]
        if timeout_s > 0:
            work.wait(datetime.timedelta(seconds=timeout_s))
        else:
            work.wait()
        if finish is not None:
            finish()

    def test(self, handle):
        with self._lock:
            work, _ = self._works[handle]
        return work.is_completed()

    def release(self, handle):
        with self._lock:
            work, _ = self._works.pop(handle, (None, None))
            if work is not None and not work.is_completed():
                self._unfinished.append(work)
            self._unfinished = [w for w in self._unfinished if not w.is_completed()]

    def destroy(self):
        dist = torch.distributed
        if not dist.is_initialized():  # the script destroyed every group already
            return
        for group in self._channels:
            dist.destroy_process_group(group)
        self._channels = []


def launched_without_mpi():
    """True when this process is one of several started by a launcher that is not MPI's
    (torchrun, the deepspeed launcher, accelerate launch: WORLD_SIZE > 1 and no MPI
    launcher's variables), or when torch.distributed is initialised outside an MPI job."""
    if any(name in os.environ for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                          "MPI_LOCALNRANKS")):
        return False
    world = os.environ.get("WORLD_SIZE", "")
    if world.isdigit() and int(world) > 1:
        return True
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


def init_from_launcher(backend=None, timeout=datetime.timedelta(minutes=30)):
    """Initialises torch.distributed's default group from a launcher's environment (RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT) unless it is initialised; True when it did.
    `backend`: None means nccl where CUDA is available, else gloo (DeepSpeed's choice)."""
    dist = torch.distributed
    if dist.is_initialized():
        return False
    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if name not in os.environ]
    if missing:
        raise errors.FailedPreconditionError(
            "zerort.torch: torch.distributed is not initialised and the launcher did not set "
            f"{', '.join(missing)}: launch with torchrun (or mpirun -np N), or call "
            "torch.distributed.init_process_group() first; for a single process, unset "
            "WORLD_SIZE", errors.FailedPreconditionError.status)
    chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(chosen, init_method="env://", timeout=timeout)
    return True


def torch_communicator(timeout_s=600.0):
    """This rank's ZeroRT communicator over torch.distributed's default process group (every
    rank of it; initialised from torchrun's environment when the script has not done so).
    Collective over that group. `timeout_s`: how long a collective may wait for a peer before
    it fails (the two gloo groups' timeout, and the cross-rank checks'); initialize() without
    comm passes the config's guard.timeout_s (600 s by default). A default group this call
    initialises gets torch's usual 30 minutes."""
    dist = torch.distributed
    if not dist.is_available():
        raise errors.UnimplementedError(
            "zerort.torch: this PyTorch was built without torch.distributed",
            errors.UnimplementedError.status)
    timeout = datetime.timedelta(seconds=timeout_s)
    init_from_launcher()  # the script's own group keeps torch's usual 30 minutes
    channels = [dist.new_group(backend="gloo", timeout=timeout) for _ in range(2)]
    world, rank = dist.get_world_size(), dist.get_rank()
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    on_this_host = int(local) if local.isdigit() and 1 <= int(local) <= world else 1
    return core.external_communicator(rank, world, _TorchCollectives(channels),
                                      ranks_on_this_host=on_this_host,
                                      check_timeout_s=timeout_s)


def default_communicator(config=None):
    """The communicator initialize(comm=None) takes: torch.distributed's ranks when a
    launcher other than MPI's started this process (or torch.distributed is initialised
    outside an MPI job), waiting for peers as long as `config`'s guard.timeout_s; else this
    process's MPI rank."""
    if launched_without_mpi():
        return torch_communicator(_guard_timeout(config))
    return core.mpi_communicator()


def _guard_timeout(config):
    """guard.timeout_s of `config` (ZeroRT's or DeepSpeed's, as initialize takes it): 600
    when it sets none, or when it cannot be read (initialize then names what is wrong)."""
    if config is None:
        return 600.0
    world = os.environ.get("WORLD_SIZE", "1")
    try:
        normalized, _ = _config.load(config, int(world) if world.isdigit() else 1)
    except errors.ZeroError:
        return 600.0
    return float(normalized.get("guard", {}).get("timeout_s", 600.0))
