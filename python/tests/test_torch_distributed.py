"""torch.distributed over ZeroRT's ranks (zerort.torch.init_torch_distributed, DeepSpeed's
deepspeed.init_distributed), and the MPI communicator in a process torchrun started, refused:
it would be an MPI world of its own and train alone. Each case runs in a fresh interpreter,
as a launched script does (torch.distributed and the environment are the process's)."""
import os
import subprocess
import sys
import textwrap

import pytest


def run_script(source, **env):
    """Runs `source` in a fresh interpreter with the test's environment plus `env`."""
    environment = dict(os.environ)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(name, None)
    environment.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], env=environment,
                          capture_output=True, text=True, timeout=120, check=False)


def test_init_distributed_gives_torch_distributed_the_ranks():
    done = run_script("""
        import os
        import torch
        import torch.distributed as dist
        import zerort
        from zerort.torch import deepspeed, init_torch_distributed
        comm = zerort.local_group(1)[0]
        assert deepspeed.init_distributed(distributed_port=0, comm=comm) is None
        assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
        assert dist.get_backend() == "gloo"
        assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("0", "1")
        value = torch.tensor([2.5])
        dist.all_reduce(value)
        sampler = torch.utils.data.distributed.DistributedSampler(list(range(5)))
        assert len(list(sampler)) == 5 and value.item() == 2.5
        assert init_torch_distributed(comm) is False  # set up already: nothing to do
        try:
            deepspeed.init_distributed(init_method="env://")
        except zerort.UnimplementedError as error:
            assert "init_method" in str(error)
        else:
            raise AssertionError("init_method was taken")
        dist.destroy_process_group()
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("launcher_rank", ["0", "2"])
def test_the_mpi_communicator_under_torchrun_is_refused_naming_both_ways(launcher_rank):
    """MPI sees a torchrun-started process alone: it would train on its own."""
    done = run_script("""
        import zerort
        try:
            zerort.mpi_communicator()
        except zerort.FailedPreconditionError as error:
            print(error)
    """, RANK=launcher_rank, WORLD_SIZE="3", LOCAL_RANK=launcher_rank)
    assert done.returncode == 0, done.stderr
    assert f"started as rank {launcher_rank} of 3" in done.stdout
    assert "mpirun -np 3" in done.stdout and "unset WORLD_SIZE" in done.stdout
    assert "zerort.torch.torch_communicator()" in done.stdout


def test_a_launch_that_sets_world_size_without_an_address_is_named():
    """initialize() without comm where WORLD_SIZE says several ranks but nothing says where
    rank 0 is (a stale WORLD_SIZE, a launcher of its own)."""
    done = run_script("""
        import zerort, zerort.torch, torch
        try:
            zerort.torch.initialize(torch.nn.Linear(2, 2), {"stage": 2})
        except zerort.FailedPreconditionError as error:
            print(error)
    """, RANK="1", WORLD_SIZE="3")
    assert done.returncode == 0, done.stderr
    assert "did not set MASTER_ADDR, MASTER_PORT" in done.stdout
    assert "unset WORLD_SIZE" in done.stdout


def test_a_master_port_that_is_no_number_is_named():
    done = run_script("""
        import zerort
        from zerort.torch import init_torch_distributed
        try:
            init_torch_distributed(zerort.local_group(1)[0])
        except zerort.InvalidArgumentError as error:
            print(error)
    """, MASTER_PORT="not-a-port")
    assert done.returncode == 0, done.stderr
    assert "MASTER_PORT='not-a-port' is not a port number" in done.stdout
