"""deepspeed.comm under its DeepSpeed names, so that `import deepspeed.comm as dist` becomes
`from zerort.torch.deepspeed import comm as dist` and the script's calls stay:

    if dist.get_rank() == 0: print(loss)       # this process's rank, torch.distributed's
    dist.all_reduce(loss); dist.barrier()      # torch.distributed's collectives

DeepSpeed's comm is torch.distributed's default group under DeepSpeed's names; here it is
torch.distributed itself. deepspeed.initialize() sets that group up over the engine's ranks
when it takes the launcher's (comm=None; under mpirun too), as DeepSpeed's does, and
init_distributed() does it on its own. get_rank(), get_world_size() and get_local_rank() also
answer before then, from the launcher (mpirun's, torchrun's or Slurm's variables; a process
started alone is rank 0 of 1), as they need no peer; every other name is torch.distributed's
(all_reduce, broadcast, all_gather, barrier, new_group, ReduceOp, ...), which needs the group.
"""
import datetime
import os

import torch

from .._deepspeed_api import refuse_unless_default
from .._torch_distributed import init_torch_distributed, launcher_local_rank

__all__ = ["init_distributed", "is_initialized", "is_available", "get_rank", "get_world_size",
           "get_local_rank", "get_global_rank"]

# Where launchers put this process's rank and the number of ranks.
_RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_SIZE_VARIABLES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")


def _launcher_says(names, default):
    """The first of the environment variables `names` that holds a number, else `default`."""
    for name in names:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return default


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=29500,
                     verbose=True, timeout=datetime.timedelta(minutes=30), init_method=None,
                     dist_init_required=None, config=None, rank=-1, world_size=-1, comm=None):
    """deepspeed.init_distributed: torch.distributed's default group over ZeroRT's ranks
    (`comm`, None: under torchrun the launcher's environment, else this process's MPI rank),
    so the script's own torch.distributed calls work under mpirun too
    (_torch_distributed.py). Nothing when torch.distributed is set up already, or when
    dist_init_required is False. `init_method`, `rank` and `world_size` (a group of other
    ranks) are named as unsupported: the group's ranks are the launcher's."""
    del auto_mpi_discovery, verbose, config  # the launcher is where the ranks come from
    refuse_unless_default("deepspeed.init_distributed", {
        "init_method": init_method, "rank": rank, "world_size": world_size}, {
        "init_method": (None, "the group's ranks are the launcher's (mpirun's or torchrun's)"),
        "rank": (-1, "the group's ranks are the launcher's (mpirun's or torchrun's)"),
        "world_size": (-1, "the group's ranks are the launcher's (mpirun's or torchrun's)")})
    if dist_init_required is False:
        return
    init_torch_distributed(comm, dist_backend, distributed_port, timeout)


def is_available():
    """Whether this PyTorch has torch.distributed."""
    return torch.distributed.is_available()


def is_initialized():
    """Whether torch.distributed's default group is set up (deepspeed.initialize() with the
    launcher's ranks, init_distributed(), or the script's own init_process_group)."""
    return is_available() and torch.distributed.is_initialized()


def get_rank(group=None):
    """This process's rank: in `group` (torch.distributed's), else in the default group, or,
    before any group is set up, the launcher's rank (0 for a process started alone)."""
    if group is not None or is_initialized():
        return torch.distributed.get_rank(group)
    return _launcher_says(_RANK_VARIABLES, 0)


def get_world_size(group=None):
    """The number of ranks: of `group`, else of the default group, or, before any group is
    set up, the launcher's count (1 for a process started alone)."""
    if group is not None or is_initialized():
        return torch.distributed.get_world_size(group)
    return _launcher_says(_SIZE_VARIABLES, 1)


def get_local_rank():
    """This process's rank on its host as the launcher says it (LOCAL_RANK, OpenMPI's,
    MPICH's, Slurm's, MVAPICH's variables), 0 when none says it."""
    return int(os.environ.get("LOCAL_RANK", launcher_local_rank() or 0))


def get_global_rank(group, group_rank):
    """The default group's rank of `group`'s rank `group_rank`."""
    return torch.distributed.get_global_rank(group, group_rank)


def __getattr__(name):
    """Any other name of deepspeed.comm is torch.distributed's (all_reduce, barrier, ...)."""
    try:
        return getattr(torch.distributed, name)
    except AttributeError:
        raise AttributeError(
            f"zerort.torch.deepspeed.comm has no {name!r}: its names are torch.distributed's "
            "(DeepSpeed's comm-only calls such as log_summary or comms logging are not "
            "provided)") from None
