"""zerort.torch with one process per rank under mpirun (CTest: python.torch.mpi.np2/np3).

Skipped when not started by mpirun. Every rank runs the same tests in the same order.
"""
import os

import pytest
import torch

import zerort
import zerort.torch
from test_torch_engine import (BATCH, OPTIMIZER, STEPS, TinyLM, assert_close,
                               batch, loss_of, reference)

pytestmark = pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" not in os.environ,
                                reason="runs under mpirun")


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def train(stage, **model_options):
    comm = zerort.mpi_communicator()
    world, rank = comm.size, comm.rank
    model = TinyLM(**model_options)
    config = {"stage": stage, "optimizer": OPTIMIZER, "guard": {"timeout_s": 60},
              "stage3": {"persistence_threshold": 0},
              "buckets": {"first_bucket_elems": 64, "reduce_bucket_elems": 256}}
    engine = zerort.torch.initialize(model, config, comm)
    # Rows split as evenly as the world allows; the loss is weighted so the ranks' mean
    # gradients average to the whole batch's.
    bounds = [BATCH * r // world for r in range(world + 1)]
    rows = slice(bounds[rank], bounds[rank + 1])
    weight = (bounds[rank + 1] - bounds[rank]) * world / BATCH
    for step in range(STEPS):
        tokens, targets = batch(step)
        (weight * loss_of(model, tokens[rows], targets[rows])).backward()
        engine.step()
    engine.close()
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    comm.close()
    return trained


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_lora_model_matches_single_process_pytorch(stage):
    assert_close(train(stage), reference())


def test_reentrant_checkpoint_with_frozen_inputs_names_the_adapters():
    with pytest.raises(zerort.UnusedParametersError) as raised:
        train(2, reentrant=True)
    assert "blocks.0.lora_a.weight" in str(raised.value)
