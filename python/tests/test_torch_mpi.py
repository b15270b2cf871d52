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


def train(stage, device="cpu", guard=None, **model_options):
    comm = zerort.mpi_communicator()
    world, rank = comm.size, comm.rank
    model = TinyLM(**model_options).to(device)
    config = {"stage": stage, "optimizer": OPTIMIZER,
              "guard": dict({"timeout_s": 60}, **(guard or {})),
              "stage3": {"persistence_threshold": 0},
              "buckets": {"first_bucket_elems": 64, "reduce_bucket_elems": 256}}
    try:
        engine = zerort.torch.initialize(model, config, comm)
        # Rows split as evenly as the world allows; the loss is weighted so the ranks' mean
        # gradients average to the whole batch's.
        bounds = [BATCH * r // world for r in range(world + 1)]
        rows = slice(bounds[rank], bounds[rank + 1])
        weight = (bounds[rank + 1] - bounds[rank]) * world / BATCH
        for step in range(STEPS):
            tokens, targets = (t.to(device) for t in batch(step))
            (weight * loss_of(model, tokens[rows], targets[rows])).backward()
            engine.step()
        engine.close()
        return {n: p.detach().clone() for n, p in model.named_parameters()
                if p.requires_grad}
    finally:
        comm.close()  # also when a step raised: no communicator outlives its test


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_lora_model_matches_single_process_pytorch(stage):
    assert_close(train(stage), reference())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_lora_model_on_the_gpu_matches_single_process_pytorch(stage):
    """Params on the GPU (the ranks may share one), the MPI communicator staging device
    values through host memory; at stage 3 each process gathers inside its own backward."""
    assert_close(train(stage, device="cuda"), reference(device="cuda"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_shared_adapter_under_reentrant_checkpoint_on_the_gpu_at_stage3():
    options = {"share_adapter": True, "reentrant": True, "input_requires_grad": True}
    trained = train(3, device="cuda", guard={"on_duplicate": "count"}, **options)
    assert_close(trained, reference(device="cuda", **options))


def test_reentrant_checkpoint_with_frozen_inputs_names_the_adapters():
    with pytest.raises(zerort.UnusedParametersError) as raised:
        train(2, reentrant=True)
    assert "blocks.0.lora_a.weight" in str(raised.value)
