"""torch.distributed over ZeroRT's ranks: a training script's own torch.distributed calls
(dist.get_rank(), dist.all_reduce(loss), dist.barrier(), a DistributedSampler built without
arguments) keep working under mpirun, where no launcher set torch.distributed up. DeepSpeed's
deepspeed.init_distributed() does the same with its MPI discovery.

    zerort.torch.init_torch_distributed()      # or deepspeed.init_distributed()
    sampler = DistributedSampler(dataset)      # this rank's share, as under torchrun

The default process group gets the ranks of a ZeroRT communicator (this process's MPI rank
when none is given; under torchrun, which set everything up, init_process_group reads the
launcher's environment instead): rank 0's address and a port travel to every rank over that
communicator, and each rank joins with init_process_group (gloo on the CPU, nccl where CUDA
is available). The environment a torchrun launch sets (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, and LOCAL_RANK where the MPI launcher tells it) is filled in where missing, for
libraries that read it. Rank 0's failure to find its address (a MASTER_PORT that is no
number) is raised on every rank.
"""
import datetime
import json
import os
import socket

import torch

from .. import core, errors
from ._device import broadcast_text
from ._torch_communicator import init_from_launcher, launched_without_mpi


def _free_port():
    """A TCP port no one listens on now (rank 0's choice when asked for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _this_host():
    """An address of this host that other hosts reach: the first non-loopback IPv4 address
    its name resolves to (Debian maps the name to 127.0.1.1), else the one a route out would
    use, else the name's own."""
    name = socket.gethostname()
    try:
        resolved = [info[4][0] for info in socket.getaddrinfo(name, None, socket.AF_INET)]
    except OSError:
        resolved = []
    outside = [address for address in resolved if not address.startswith("127.")]
    if outside:
        return outside[0]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # a UDP connect sends nothing: the route's source
            return probe.getsockname()[0]
    except OSError:
        return resolved[0] if resolved else "127.0.0.1"


def _rank_zero_address(port):
    """Where rank 0's store listens: MASTER_ADDR / MASTER_PORT when set, else this host's
    address and `port` (0: a free one)."""
    host = os.environ.get("MASTER_ADDR") or _this_host()
    given = os.environ.get("MASTER_PORT")
    try:
        port = int(given) if given else (port or _free_port())
    except ValueError:
        raise errors.InvalidArgumentError(
            f"zerort.torch: MASTER_PORT={given!r} is not a port number",
            errors.InvalidArgumentError.status) from None
    return host, port


def launcher_local_rank():
    """This process's rank on its host as the launcher says it (OpenMPI, MPICH/Hydra, Slurm,
    MVAPICH), or None."""
    for name in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                 "MV2_COMM_WORLD_LOCAL_RANK"):
        if os.environ.get(name, "").isdigit():
            return os.environ[name]
    return None


def init_torch_distributed(comm=None, backend=None, port=29500,
                           timeout=datetime.timedelta(minutes=30)):
    """Initialises torch.distributed's default process group over the ranks of `comm` (a
    zerort.core.Communicator; None: this process's MPI rank, as initialize() takes it, or
    under torchrun the launcher's environment), and
    returns True; does nothing and returns False when torch.distributed is initialised
    already. Collective. `backend`: "gloo", "nccl" (None: nccl where CUDA is available,
    else gloo); `port`: rank 0's, unless MASTER_PORT says otherwise (0: a free one)."""
    if not torch.distributed.is_available():
        raise errors.UnimplementedError(
            "zerort.torch: this PyTorch was built without torch.distributed",
            errors.UnimplementedError.status)
    if torch.distributed.is_initialized():
        return False
    if comm is None and launched_without_mpi():  # torchrun: its environment says it all
        return init_from_launcher(backend, timeout)
    own = comm is None
    if own:
        comm = core.mpi_communicator()
    try:
        text = ""
        if comm.rank == 0:  # what it found, or why it could not: every rank raises then
            try:
                host, chosen = _rank_zero_address(port)
                chosen_backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
                text = json.dumps({"address": [host, chosen, chosen_backend]})
            except Exception as error:  # noqa: BLE001 - every rank raises it below
                message = getattr(error, "message", f"{type(error).__name__}: {error}")
                text = json.dumps({"error": message})
        found = json.loads(broadcast_text(comm, text, 0, timeout.total_seconds()))
        if "error" in found:
            raise errors.InvalidArgumentError(found["error"] + " (rank 0's)",
                                              errors.InvalidArgumentError.status)
        host, chosen, chosen_backend = found["address"]
        rank, world = comm.rank, comm.size
    finally:
        if own:
            comm.close()
    local_rank = launcher_local_rank()
    for name, value in (("RANK", rank), ("WORLD_SIZE", world), ("MASTER_ADDR", host),
                        ("MASTER_PORT", chosen), ("LOCAL_RANK", local_rank)):
        if value is not None:
            os.environ.setdefault(name, str(value))
    torch.distributed.init_process_group(chosen_backend, init_method=f"tcp://{host}:{chosen}",
                                         rank=rank, world_size=world, timeout=timeout)
    return True
