"""One rank of an MPI job whose rank 1 fails outside any collective (test_mpi_jobs.py runs it
under mpirun):

    mpi_job_rank.py SCENARIO

fails_before_second_communicator: rank 1 raises after a first communicator; the others go on
to initialize() with comm=None, which creates a second one (collective over every rank).
fails_between_steps: rank 1 raises between two steps; the others go on to the next step.
exits_between_steps: rank 1 calls sys.exit(1) there instead.
Each rank prints "rank R finished" when it gets through (none should).
"""
import sys

import torch

import zerort
import zerort.torch
from test_torch_engine import OPTIMIZER, TinyLM, batch, loss_of

CONFIG = {"stage": 2, "optimizer": OPTIMIZER, "guard": {"timeout_s": 300}}


def main(scenario):
    torch.set_num_threads(1)
    comm = zerort.mpi_communicator()
    rank = comm.rank
    model = TinyLM()
    if scenario == "fails_before_second_communicator":
        if rank == 1:
            raise FileNotFoundError("rank 1 cannot find its data shard")
        zerort.torch.initialize(model, CONFIG)
    elif scenario in ("fails_between_steps", "exits_between_steps"):
        engine = zerort.torch.initialize(model, CONFIG, comm)
        for step in range(3):
            if rank == 1 and step == 1 and scenario == "exits_between_steps":
                sys.exit(1)
            if rank == 1 and step == 1:
                raise FileNotFoundError("rank 1 cannot find its next batch")
            loss_of(model, *batch(step)).backward()
            engine.step()
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    print(f"rank {rank} finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
