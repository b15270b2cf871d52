"""torch.distributed over ZeroRT's ranks: a training script's own torch.distributed calls
(dist.get_rank(), dist.all_reduce(loss), dist.barrier(), a DistributedSampler built without
arguments) keep working under mpirun, where no launcher set torch.distributed up. DeepSpeed's
deepspeed.init_distributed() does the same with its MPI discovery.

    zerort.torch.init_torch_distributed()      # or deepspeed.init_distributed()
    sampler = DistributedSampler(dataset)      # this rank's share, as under torchrun

The default process group gets the ranks of a ZeroRT communicator (this process's MPI rank
when none is given): rank 0's address and a port travel to every rank over that
communicator, and each rank joins with init_process_group (gloo on the CPU, nccl where CUDA
is available). The environment a torchrun launch sets (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) is filled in where missing, for libraries that read it.
"""
import datetime
import json
import os
import socket

import torch

from .. import core, errors
from ._device import broadcast_tensor

_ADDRESS_BYTES = 512  # rank 0's "host", port and backend, as JSON, padded


def _free_port():
    """A TCP port no one listens on now (rank 0's choice when asked for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _rank_zero_address(port):
    """Where rank 0's store listens: MASTER_ADDR / MASTER_PORT when set, else this host's
    address and `port` (0: a free one)."""
    host = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
    port = int(os.environ.get("MASTER_PORT") or port or _free_port())
    return host, port


def init_torch_distributed(comm=None, backend=None, port=29500,
                           timeout=datetime.timedelta(minutes=30)):
    """Initialises torch.distributed's default process group over the ranks of `comm` (a
    zerort.core.Communicator; None: this process's MPI rank, as initialize() takes it), and
    returns True; does nothing and returns False when torch.distributed is initialised
    already. Collective. `backend`: "gloo", "nccl" (None: nccl where CUDA is available,
    else gloo); `port`: rank 0's, unless MASTER_PORT says otherwise (0: a free one)."""
    if not torch.distributed.is_available():
        raise errors.UnimplementedError(
            "zerort.torch: this PyTorch was built without torch.distributed",
            errors.UnimplementedError.status)
    if torch.distributed.is_initialized():
        return False
    own = comm is None
    if own:
        comm = core.mpi_communicator()
    try:
        payload = torch.zeros(_ADDRESS_BYTES, dtype=torch.uint8)
        if comm.rank == 0:
            host, chosen = _rank_zero_address(port)
            chosen_backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
            text = json.dumps([host, chosen, chosen_backend]).encode()[:_ADDRESS_BYTES]
            payload[:len(text)] = torch.tensor(list(text), dtype=torch.uint8)
        broadcast_tensor(payload, comm, 0, timeout.total_seconds())
        host, chosen, chosen_backend = json.loads(bytes(payload.tolist()).rstrip(b"\0"))
        rank, world = comm.rank, comm.size
    finally:
        if own:
            comm.close()
    for name, value in (("RANK", rank), ("WORLD_SIZE", world), ("MASTER_ADDR", host),
                        ("MASTER_PORT", chosen),
                        ("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0))):
        os.environ.setdefault(name, str(value))
    torch.distributed.init_process_group(chosen_backend, init_method=f"tcp://{host}:{chosen}",
                                         rank=rank, world_size=world, timeout=timeout)
    return True
