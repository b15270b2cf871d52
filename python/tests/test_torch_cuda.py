"""zerort.torch with the model on the GPU (device "cuda"), against single-process PyTorch
on the same GPU: in-process ranks sharing the device, and NCCL.

Skipped where PyTorch sees no GPU or the library was built without CUDA.
"""
import pytest
import torch

import zerort
import zerort.torch
from test_torch_engine import (OPTIMIZER, STEPS, TinyLM, assert_close, batch,
                               check_half_precision, loss_of, reference, train_sharded)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module", autouse=True)
def cuda_build():
    """Skips the module when the library has no CUDA path."""
    comm = zerort.local_group(1)[0]
    try:
        zerort.Engine({"device": "cuda"}, comm).close()
    except (zerort.UnimplementedError, zerort.UnavailableError) as error:
        pytest.skip(f"the library cannot drive the GPU: {error}")
    finally:
        comm.close()


# In-process ranks share the one GPU and PyTorch's one autograd thread for it: two ranks at
# stages 0-2, one rank at stage 3 (a stage-3 gather inside backward would wait for a peer
# queued behind it; initialize() refuses that, tested below).
@pytest.mark.parametrize("stage,world", [(0, 2), (1, 2), (2, 2), (3, 1)])
def test_lora_model_on_the_gpu_matches_single_process_pytorch(stage, world):
    want = reference(device="cuda")
    for trained in train_sharded(stage, world=world, device="cuda"):
        assert all(t.is_cuda for t in trained.values())
        assert_close(trained, want)


@pytest.mark.parametrize("stage,world", [(2, 2), (3, 1)])
def test_shared_adapter_under_reentrant_checkpoint_on_the_gpu(stage, world):
    """One gradient per checkpointed block for the shared adapter, counted; at stage 3 the
    recomputed forward gathers its unit again, on the GPU."""
    options = {"share_adapter": True, "reentrant": True, "input_requires_grad": True}
    want = reference(device="cuda", **options)
    for trained in train_sharded(stage, world=world, guard={"on_duplicate": "count"},
                                 device="cuda", **options):
        assert_close(trained, want)


def test_stage3_on_the_gpu_refuses_in_process_ranks():
    comms = zerort.local_group(2)
    with pytest.raises(zerort.UnimplementedError, match="one process per rank"):
        zerort.torch.initialize(TinyLM().cuda(), {"stage": 3}, comms[0])
    for comm in comms:
        comm.close()


def test_reentrant_checkpoint_with_frozen_inputs_names_the_adapters_on_the_gpu():
    with pytest.raises(zerort.UnusedParametersError) as raised:
        train_sharded(2, reentrant=True, device="cuda")
    assert "blocks.0.lora_a.weight" in str(raised.value)


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_half_precision_params_on_the_gpu_train_and_skip_overflowing_steps(dtype, name):
    check_half_precision(dtype, name, device="cuda")


def test_params_are_views_of_the_engines_device_memory():
    comm = zerort.local_group(1)[0]
    model = TinyLM().cuda()
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": OPTIMIZER}, comm)
    pid = next(i for n, _, i in engine._params if n == "head.weight")
    assert model.head.weight.data_ptr() == engine.engine.param_data(pid)
    before = model.head.weight.detach().clone()
    loss_of(model, *(t.cuda() for t in batch(0))).backward()
    engine.step()
    assert not torch.equal(model.head.weight, before)
    assert torch.equal(model.head.weight, engine.state_dict()["head.weight"])
    engine.close()
    comm.close()


def test_config_device_that_disagrees_with_the_model_is_an_invalid_argument():
    comm = zerort.local_group(1)[0]
    with pytest.raises(zerort.InvalidArgumentError, match=r'model\.to\("cpu"\)'):
        zerort.torch.initialize(TinyLM().cuda(), {"device": "cpu"}, comm)
    comm.close()


def nccl_or_skip(stream=None):
    """A one-rank NCCL communicator (one GPU here), bootstrapped over an in-process group;
    skips the test in builds without NCCL."""
    bootstrap = zerort.local_group(1)[0]
    try:
        return zerort.nccl_communicator(bootstrap, stream=stream)
    except zerort.UnimplementedError as error:
        pytest.skip(f"built without NCCL: {error}")
    finally:
        bootstrap.close()


def train_one_rank(comm, stage, stream=None):
    """Trains the LoRA model on `comm`'s one rank over the whole batch, forward and backward
    on `stream` (None: the current one); returns the trained params."""
    model = TinyLM().cuda()
    engine = zerort.torch.initialize(model, {"stage": stage, "optimizer": OPTIMIZER}, comm)
    for step in range(STEPS):
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # None: no change of stream
            loss_of(model, *(t.cuda() for t in batch(step))).backward()
        engine.step()
    engine.close()
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    comm.close()
    return trained


@pytest.mark.parametrize("stage", [2, 3])
def test_nccl_one_rank_matches_single_process_pytorch(stage):
    assert_close(train_one_rank(nccl_or_skip(), stage), reference(device="cuda"))


def test_backward_on_a_side_stream_matches_single_process_pytorch():
    """The engine follows the stream current at initialize(); a gradient computed on another
    stream is waited for, and its memory kept, until the engine's copy has read it."""
    trained = train_one_rank(zerort.local_group(1)[0], 2, stream=torch.cuda.Stream())
    assert_close(trained, reference(device="cuda"))


def test_nccl_communicator_on_another_stream_is_an_invalid_argument():
    comm = nccl_or_skip(stream=torch.cuda.Stream().cuda_stream)
    with pytest.raises(zerort.InvalidArgumentError, match=r"nccl_communicator\(stream="):
        zerort.torch.initialize(TinyLM().cuda(), {"stage": 2}, comm)
    comm.close()
