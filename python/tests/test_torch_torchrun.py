"""zerort.torch in processes started by torchrun, without MPI (CTest:
python.torch.torchrun.np2 and np3): the ranks are torch.distributed's, the collectives
gloo's through ZeroRT's external communicator.

Skipped unless a launcher other than MPI's set WORLD_SIZE. Every rank runs the same tests in
the same order.
"""
import gc
import os
import time

import pytest
import torch

import zerort
import zerort.torch
from test_torch_engine import OPTIMIZER, TinyLM, assert_close, batch, loss_of, reference
from test_torch_mpi import check_sharded_lora_job, train
from test_torch_optimizer import lambda_lr
from test_torch_optimizer import reference as groups_reference

pytestmark = pytest.mark.skipif(
    "WORLD_SIZE" not in os.environ or "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="runs under torchrun")


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def test_the_communicator_has_torch_distributeds_ranks():
    comm = zerort.torch.torch_communicator(timeout_s=60)
    try:
        dist = torch.distributed
        world = dist.get_world_size()
        assert comm.backend == "external"
        assert (comm.rank, comm.size) == (dist.get_rank(), world)
        assert comm.size == int(os.environ["WORLD_SIZE"])
        values = torch.tensor([float(comm.rank), 1.5, -2.0])
        comm.all_reduce_f32(values.data_ptr(), 3, "sum", 60)
        assert values.tolist() == [world * (world - 1) / 2, 1.5 * world, -2.0 * world]
        values = torch.tensor([float(comm.rank), -float(comm.rank), 0.5])
        comm.all_reduce_f32(values.data_ptr(), 3, "max", 60)
        assert values.tolist() == [world - 1.0, 0.0, 0.5]
        text = torch.tensor(list(b"rank zero's") if comm.rank == 0 else [0] * 11,
                            dtype=torch.uint8)
        comm.broadcast_bytes(text.data_ptr(), 11, 0, 60)
        assert bytes(text.tolist()) == b"rank zero's"
    finally:
        comm.close()


def test_ranks_whose_values_differ_in_size_get_an_error_naming_both():
    """A tagged collective (values) whose size differs on rank 0 fails on every rank with
    both sides named, instead of gloo pairing buffers of different sizes."""
    comm = zerort.torch.torch_communicator(timeout_s=60)
    try:
        count = 4 if comm.rank == 0 else 3
        values = torch.ones(4)
        with pytest.raises(zerort.InvalidArgumentError) as raised:
            comm.all_reduce_f32(values.data_ptr(), count, "sum", 60)
        message = str(raised.value)
        assert "mismatch" in message and "count=4" in message and "count=3" in message
    finally:
        comm.close()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_lora_model_matches_single_process_pytorch(stage):
    assert_close(train(stage, make_comm=zerort.torch.torch_communicator), reference())


@pytest.mark.parametrize("stage", [1, 3])
def test_param_groups_and_lambda_lr_match_pytorch(stage):
    want, _ = groups_reference(lambda_lr)
    assert_close(train(stage, groups=True, make_scheduler=lambda_lr,
                       make_comm=zerort.torch.torch_communicator), want)


def test_lora_job_shards_its_frozen_base_at_stage3():
    check_sharded_lora_job(lambda: zerort.torch.torch_communicator(timeout_s=60))


def test_initialize_without_comm_takes_the_launchers_ranks():
    """initialize(model, config) with no communicator, as a DeepSpeed script calls it under
    torchrun, with bf16 params (16-bit gradients reduced through the table's fp32 sums): every
    rank ends with the same changed params; the script's own dist.all_reduce(loss) still
    works beside it."""
    from zerort.torch import deepspeed
    deepspeed.init_distributed()  # torch.distributed is up already: nothing to do
    model = TinyLM().to(torch.bfloat16)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": OPTIMIZER["lr"]}},
        "zero_optimization": {"stage": 2}})
    dist = torch.distributed
    assert engine._comm.backend == "external" and engine._comm.rank == dist.get_rank()
    tokens, _ = batch(0)
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    logits = engine(tokens)
    loss = logits.float().square().mean()
    engine.backward(loss)
    engine.step()
    changed = [n for n, p in model.named_parameters()
               if not torch.equal(p.detach().float(), before[n])]
    assert changed, "the step changed nothing"
    for name, param in model.named_parameters():  # the same on every rank
        mine = param.detach().float().clone()
        rank_zeros = mine.clone()
        dist.broadcast(rank_zeros, 0)
        assert torch.equal(mine, rank_zeros), name
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    assert torch.isfinite(mean)
    engine.close()


def test_closed_engines_leave_no_gloo_groups_behind():
    """Each engine built without comm makes two gloo groups (their threads and sockets);
    closing it destroys them, so a script that rebuilds engines does not run out."""
    def threads_and_files():
        return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))

    seen = []
    for _ in range(4):
        model = TinyLM()
        engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": OPTIMIZER})
        loss_of(model, *batch(0)).backward()
        engine.step()
        engine.close()
        del engine
        gc.collect()
        seen.append(threads_and_files())
    assert seen[-1] == seen[0], seen


def test_a_stalled_peer_fails_the_others_after_guard_timeout_at_stage3():
    """Stage-3 gathers are checked across ranks before they run; the check waits as long as
    the config's guard.timeout_s (not gloo's 30 minutes): the ranks rank 1 keeps waiting get
    DeadlineExceededError naming the gather, and rank 1, arriving late, an error too."""
    model = TinyLM()
    engine = zerort.torch.initialize(model, {
        "stage": 3, "optimizer": OPTIMIZER, "guard": {"timeout_s": 3},
        "stage3": {"persistence_threshold": 0}})
    rank = engine.global_rank
    loss_of(model, *batch(0)).backward()
    engine.step()
    started = time.monotonic()
    with pytest.raises(zerort.ZeroError) as raised:
        if rank == 1:
            time.sleep(8)
        loss_of(model, *batch(1)).backward()
        engine.step()
    if rank != 1:
        assert isinstance(raised.value, zerort.DeadlineExceededError), raised.value
        assert "gathering unit" in str(raised.value)
        assert time.monotonic() - started < 7
    with pytest.raises(zerort.ZeroError, match="broken"):
        engine.close()  # the model's full values cannot be gathered any more
