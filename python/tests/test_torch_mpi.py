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
from test_torch_misuse import WithBuffer
from test_torch_optimizer import lambda_lr, param_groups
from test_torch_optimizer import reference as groups_reference
from test_torch_stage3 import LoraLM, check_lora_job, train_lora_job

pytestmark = pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" not in os.environ,
                                reason="runs under mpirun")


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def train(stage, device="cpu", guard=None, groups=False, make_scheduler=None,
          make_comm=zerort.mpi_communicator, **model_options):
    comm = make_comm()
    world, rank = comm.size, comm.rank
    model = TinyLM(**model_options).to(device)
    config = {"stage": stage, "optimizer": OPTIMIZER,
              "guard": dict({"timeout_s": 60}, **(guard or {})),
              "stage3": {"persistence_threshold": 0},
              "buckets": {"first_bucket_elems": 64, "reduce_bucket_elems": 256}}
    try:
        engine = zerort.torch.initialize(
            model, config, comm, model_parameters=param_groups(model) if groups else None)
        scheduler = make_scheduler(engine.optimizer) if make_scheduler else None
        # Rows split as evenly as the world allows; the loss is weighted so the ranks' mean
        # gradients average to the whole batch's.
        bounds = [BATCH * r // world for r in range(world + 1)]
        rows = slice(bounds[rank], bounds[rank + 1])
        weight = (bounds[rank + 1] - bounds[rank]) * world / BATCH
        for step in range(STEPS):
            tokens, targets = (t.to(device) for t in batch(step))
            (weight * loss_of(model, tokens[rows], targets[rows])).backward()
            engine.step()
            if scheduler is not None:
                scheduler.step()
        engine.close()
        return {n: p.detach().clone() for n, p in model.named_parameters()
                if p.requires_grad}
    finally:
        comm.close()  # also when a step raised: no communicator outlives its test


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_lora_model_matches_single_process_pytorch(stage):
    assert_close(train(stage), reference())


def check_sharded_lora_job(make_comm=zerort.mpi_communicator):
    """97 % frozen, a tied output layer through F.linear: each process holds about 1/N."""
    comm = make_comm()
    world = comm.size
    try:
        result = train_lora_job(LoraLM(), comm.rank, world, comm)
    finally:
        comm.close()
    check_lora_job(result, world)


def test_lora_job_shards_its_frozen_base_at_stage3():
    check_sharded_lora_job()


def test_init_context_builds_the_lora_job_sharded():
    """Each process builds the model inside init_context (its slices only), then trains it
    at stage 3 exactly as the model built whole."""
    comm = zerort.mpi_communicator()
    world = comm.size
    try:
        with zerort.torch.init_context(comm):
            model = LoraLM()
        assert all(p.untyped_storage().nbytes() <= p.element_size()
                   if hasattr(p, "untyped_storage") else p.storage().size() <= 1
                   for p in model.parameters())  # one-element placeholders
        result = train_lora_job(model, comm.rank, world, comm)
    finally:
        comm.close()
    check_lora_job(result, world)


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


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_param_groups_and_lambda_lr_match_pytorch(stage):
    """Two param groups (their own lr and weight decay) and LambdaLR on engine.optimizer
    equal torch.optim.AdamW with the same groups and LambdaLR on the whole batch."""
    want, _ = groups_reference(lambda_lr)
    assert_close(train(stage, groups=True, make_scheduler=lambda_lr), want)


def test_all_reduce_over_mpi_ranks():
    comm = zerort.mpi_communicator()
    try:
        engine = zerort.torch.initialize(TinyLM(), {"stage": 1}, comm)
        world, rank = comm.size, comm.rank
        values = torch.tensor([float(rank), -float(rank), 1.0])
        ranks = torch.arange(world, dtype=torch.float32)
        assert engine.all_reduce(values.clone(), "sum").tolist() == [
            ranks.sum().item(), -ranks.sum().item(), float(world)]
        assert engine.all_reduce(values.clone(), "mean").tolist() == pytest.approx(
            [ranks.mean().item(), -ranks.mean().item(), 1.0])
        assert engine.all_reduce(values.clone(), "max").tolist() == [world - 1.0, 0.0, 1.0]
        assert engine.all_reduce(values.clone(), "min").tolist() == [0.0, 1.0 - world, 1.0]
        engine.close()
    finally:
        comm.close()


def test_init_distributed_gives_torch_distributed_the_mpi_ranks():
    """deepspeed.init_distributed() under mpirun: the script's own torch.distributed calls
    see the MPI ranks (a free port: np2 and np3 may run at once)."""
    from zerort.torch import deepspeed
    deepspeed.init_distributed(distributed_port=0)
    try:
        world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        dist = torch.distributed
        assert (dist.get_rank(), dist.get_world_size()) == (rank, world)
        assert os.environ["RANK"] == str(rank) and os.environ["WORLD_SIZE"] == str(world)
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        assert value.item() == world * (world + 1) / 2
        shares = torch.utils.data.distributed.DistributedSampler(list(range(12)), shuffle=False)
        assert list(shares) == list(range(rank, 12, world))
        dist.barrier()
    finally:
        torch.distributed.destroy_process_group()


def test_deepspeed_initialize_sets_torch_distributed_up_over_the_mpi_ranks():
    """deepspeed.initialize() with the launcher's ranks under mpirun sets torch.distributed's
    default group up, as DeepSpeed's does: the script's deepspeed.comm (and torch.distributed)
    calls see the engine's ranks; dist_init_required=False leaves it alone."""
    from zerort.torch import deepspeed
    from zerort.torch.deepspeed import comm as dist
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    assert (dist.get_rank(), dist.get_world_size()) == (rank, world)  # the launcher's
    engine, *_ = deepspeed.initialize(model=TinyLM(), config=config, dist_init_required=False)
    assert not dist.is_initialized()
    engine.close()
    engine, *_ = deepspeed.initialize(model=TinyLM(), config=config)
    try:
        assert dist.is_initialized() and torch.distributed.is_initialized()
        assert (dist.get_rank(), dist.get_world_size()) == (engine.rank, engine.world_size)
        assert (engine.rank, engine.world_size) == (rank, world)
        loss = torch.tensor([float(rank + 1)])
        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
        assert loss.item() == world * (world + 1) / 2
        dist.barrier()
    finally:
        engine.close()
        torch.distributed.destroy_process_group()


def test_frozen_state_of_another_shape_on_one_rank_is_named():
    """A buffer whose shape differs on rank 1 (and 2): every rank raises, naming the buffer
    with both shapes, instead of broadcasting rank 0's bytes into it."""
    comm = zerort.mpi_communicator()
    try:
        model = WithBuffer(80 + comm.rank)
        with pytest.raises(zerort.InvalidArgumentError) as raised:
            zerort.torch.initialize(model, {"stage": 2, "guard": {"timeout_s": 60}}, comm)
        message = str(raised.value)
        assert "mask: shape (80,)" in message and "mask: shape (81,)" in message
    finally:
        comm.close()
