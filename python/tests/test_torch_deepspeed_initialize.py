"""zerort.torch.deepspeed.initialize, deepspeed.initialize's signature and return value: a
script's own torch optimizer and scheduler callable (as Hugging Face's Trainer passes them),
the training data as this rank's loader, and the arguments it refuses, each named. The ranks
are threads (zerort.local_group)."""
import argparse
import json

import pytest
import torch

import zerort
import zerort.torch
from zerort.torch import deepspeed
from test_torch_engine import BATCH, STEPS, TinyLM, assert_close, batch, loss_of, run_ranks

DS_CONFIG = {"zero_optimization": {"stage": 2}, "gradient_clipping": 0.0,
             "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def hf_groups(model):
    """Hugging Face's Trainer's groups: weight decay on weights, none on biases and norms."""
    decay = [p for n, p in model.named_parameters()
             if p.requires_grad and not n.endswith("bias") and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters()
                if p.requires_grad and (n.endswith("bias") or "norm" in n)]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


OPTIMIZERS = {
    "adamw": lambda groups: torch.optim.AdamW(groups, lr=0.01, betas=(0.9, 0.99), eps=1e-7),
    "adam": lambda groups: torch.optim.Adam(groups, lr=0.01),
    "sgd": lambda groups: torch.optim.SGD(groups, lr=0.05, momentum=0.9, nesterov=True),
}


def warmup(optimizer):
    """The scheduler callable a trainer passes: a linear warmup over 4 steps."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))


def reference(kind):
    """Single-process PyTorch: the optimizer over Hugging Face's groups and the warmup."""
    model = TinyLM()
    optimizer = OPTIMIZERS[kind](hf_groups(model))
    scheduler = warmup(optimizer)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, *batch(step)).backward()
        optimizer.step()
        scheduler.step()
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("built", [False, True])
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 3])
def test_a_scripts_own_optimizer_and_scheduler_train_as_in_pytorch(kind, stage, built):
    """The script's optimizer with its scheduler as a callable, or (`built`) built on that
    optimizer before initialize, as DeepSpeed scripts often pass both."""
    models = [TinyLM() for _ in range(2)]
    config = dict(DS_CONFIG, zero_optimization={"stage": stage,
                                                "stage3_param_persistence_threshold": 0})

    def body(rank, comm):
        model = models[rank]
        client = OPTIMIZERS[kind](hf_groups(model))
        engine, optimizer, loader, scheduler = deepspeed.initialize(
            model=model, optimizer=client, lr_scheduler=warmup(client) if built else warmup,
            config=config, comm=comm)
        assert optimizer is engine.optimizer and loader is None
        assert scheduler is engine.lr_scheduler and scheduler.optimizer is engine.optimizer
        assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
        mine = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
        for step in range(STEPS):
            tokens, targets = batch(step)
            engine.backward(loss_of(model, tokens[mine], targets[mine]))
            engine.step()  # steps the scheduler too, as DeepSpeed's engine
        engine.close()
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    want = reference(kind)
    for got in run_ranks(2, body):
        assert_close(got, want)


@pytest.mark.parametrize("drop_last", [False, True])
def test_training_data_becomes_this_ranks_loader_and_the_config_may_come_from_args(
        tmp_path, drop_last):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(dict(DS_CONFIG, dataloader_drop_last=drop_last,
                                    optimizer={"type": "AdamW", "params": {"lr": 1e-3}})))
    args = argparse.Namespace(deepspeed_config=str(path), local_rank=0)
    dataset = torch.utils.data.TensorDataset(torch.arange(20.0))
    models = [TinyLM() for _ in range(2)]

    def body(rank, comm):
        engine, _, loader, scheduler = deepspeed.initialize(
            args=args, model=models[rank], model_parameters=models[rank].parameters(),
            training_data=dataset, comm=comm)
        assert scheduler is None
        seen = [row for (rows,) in loader for row in rows.tolist()]
        sizes = [len(rows) for (rows,) in loader]
        engine.close()
        return seen, sizes

    (first, sizes0), (second, sizes1) = run_ranks(2, body)
    assert not set(first) & set(second)  # each rank its own share
    assert sizes0 == sizes1 == ([4, 4] if drop_last else [4, 4, 2])
    if not drop_last:
        assert sorted(first + second) == [float(i) for i in range(20)]


@pytest.mark.parametrize("arguments,words", [
    (lambda m: {"optimizer": torch.optim.AdamW(m.parameters()),
                "config": dict(DS_CONFIG, optimizer={"type": "AdamW", "params": {"lr": 1e-3}})},
     ["both", "optimizer"]),
    (lambda m: {"lr_scheduler": warmup(torch.optim.SGD(m.parameters(), lr=0.1)),
                "config": DS_CONFIG}, ["another optimizer", "callable"]),
    (lambda m: {"lr_scheduler": warmup, "config": dict(DS_CONFIG, scheduler={
        "type": "WarmupLR", "params": {"warmup_num_steps": 2}})}, ["both", "scheduler"]),
    (lambda m: {"config": DS_CONFIG, "config_params": DS_CONFIG}, ["twice", "config_params"]),
    (lambda m: {}, ["no config"]),
    (lambda m: {"optimizer": torch.optim.AdamW(m.parameters(), amsgrad=True),
                "config": DS_CONFIG}, ["amsgrad"]),
    (lambda m: {"optimizer": torch.optim.RMSprop(m.parameters()), "config": DS_CONFIG},
     ["RMSprop", "AdamW, Adam and SGD"]),
    (lambda m: {"mpu": object(), "config": DS_CONFIG}, ["mpu"]),
])
def test_what_it_cannot_do_is_named(arguments, words):
    model = TinyLM()
    comm = zerort.local_group(1)[0]
    with pytest.raises(zerort.ZeroError) as raised:
        deepspeed.initialize(model=model, comm=comm, **arguments(model))
    assert all(word in str(raised.value) for word in words), str(raised.value)
    comm.close()


def test_a_groups_own_keys_stay_in_the_optimizers_groups():
    """A group's "name" or timm's "lr_scale" is the trainer's, kept as PyTorch keeps it; an
    option that would change the step (amsgrad) is named instead of dropped."""
    model = TinyLM()
    comm = zerort.local_group(1)[0]
    groups = hf_groups(model)
    groups[0]["name"], groups[1]["lr_scale"] = "decay", 0.5
    engine = zerort.torch.initialize(model, DS_CONFIG, comm, model_parameters=groups)
    kept = engine.optimizer.param_groups
    assert kept[0]["name"] == "decay" and kept[1]["lr_scale"] == 0.5
    assert [g["weight_decay"] for g in kept] == [0.1, 0.0]
    engine.close()
    other = TinyLM()
    with pytest.raises(zerort.UnimplementedError) as raised:
        zerort.torch.initialize(other, DS_CONFIG, comm, model_parameters=[
            {"params": [p for p in other.parameters() if p.requires_grad], "amsgrad": True}])
    assert "amsgrad" in str(raised.value)
    comm.close()


def test_the_engine_steps_the_scheduler_and_checkpoints_carry_it(tmp_path):
    """As DeepSpeed's engine: step() steps the scheduler the script handed over, and a
    checkpoint saves and loads its position."""
    comm = zerort.local_group(1)[0]

    def build():
        model = TinyLM()
        return deepspeed.initialize(model=model, optimizer=OPTIMIZERS["adamw"](hf_groups(model)),
                                    lr_scheduler=warmup, config=DS_CONFIG, comm=comm)

    engine, optimizer, _, scheduler = build()
    for step in range(3):
        engine.backward(loss_of(engine.module, *batch(step)))
        engine.step()
    assert scheduler.last_epoch == 3
    # warmed up: factor 1; shown as 0.01, not the engine's float32 0.009999999776
    assert optimizer.param_groups[0]["lr"] == 0.01
    engine.save_checkpoint(str(tmp_path))
    engine.close()
    resumed, resumed_optimizer, _, resumed_scheduler = build()
    assert resumed_scheduler.last_epoch == 0
    resumed.load_checkpoint(str(tmp_path))
    assert resumed_scheduler.last_epoch == 3
    assert resumed_optimizer.param_groups[0]["lr"] == 0.01  # read back from the checkpoint
    # engine.optimizer.step() steps it, as engine.step() does
    resumed.backward(loss_of(resumed.module, *batch(3)))
    resumed_optimizer.step()
    assert resumed_scheduler.last_epoch == 4
    resumed.close()
    comm.close()


def test_a_checkpoint_without_the_scheduler_is_said_at_its_load(tmp_path):
    """A scheduler handed over to an engine that loads a checkpoint saved without one would
    start its warmup again: said with a warning."""
    comm = zerort.local_group(1)[0]
    unscheduled = zerort.torch.initialize(TinyLM(), DS_CONFIG, comm)
    unscheduled.save_checkpoint(str(tmp_path))
    unscheduled.close()
    scheduled = zerort.torch.initialize(TinyLM(), DS_CONFIG, comm)
    scheduled.drive_lr_scheduler(warmup(scheduled.optimizer))
    with pytest.warns(UserWarning, match="without an lr scheduler"):
        scheduled.load_checkpoint(str(tmp_path))
    scheduled.close()
    comm.close()


def test_deepspeeds_zero_and_utils_names_reach_zerorts_calls():
    """deepspeed.zero.GatheredParameters writes rank 0's values into a stage-3 param (and
    does nothing when not enabled); deepspeed.utils.set_z3_leaf_modules flags a leaf."""
    model = TinyLM()
    deepspeed.utils.set_z3_leaf_modules(model, [torch.nn.LayerNorm])
    assert deepspeed.utils.z3_leaf_module(model.blocks[0].norm)
    comm = zerort.local_group(1)[0]
    engine, _, _, _ = deepspeed.initialize(model=model, comm=comm, config=dict(
        DS_CONFIG, zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0}))
    with deepspeed.zero.GatheredParameters(model.head.weight, modifier_rank=0):
        with torch.no_grad():
            model.head.weight.fill_(0.5)
    with deepspeed.zero.GatheredParameters([model.head.weight], enabled=False):
        pass
    assert torch.equal(engine.state_dict()["head.weight"],
                       torch.full_like(engine.state_dict()["head.weight"], 0.5))
    engine.close()
    comm.close()


def test_zero_init_builds_the_model_sharded_as_init_context():
    """deepspeed.zero.Init: each rank keeps its slice of the model built in the block (none
    with enabled=False); deepspeed.initialize() puts it together, and the ranks train one
    replica. Options ZeroRT does not have are named."""
    from zerort.torch import _init_context
    world = 2

    def body(rank, comm):
        with deepspeed.zero.Init(comm=comm, config_dict_or_path=DS_CONFIG, enabled=True):
            model = TinyLM()
        sharded = all(_init_context.is_sharded(p) for p in model.parameters() if p.dim() > 0)
        with deepspeed.zero.Init(comm=comm, enabled=False):
            plain = TinyLM()
        assert not any(_init_context.is_sharded(p) for p in plain.parameters())
        config = dict(DS_CONFIG, zero_optimization={"stage": 3})
        engine, _, _, _ = deepspeed.initialize(model=model, config=config, comm=comm)
        for step in range(3):
            engine.backward(loss_of(model, *batch(step)))
            engine.step()
        state = engine.module_state_dict()
        engine.close()
        return sharded, state

    results = run_ranks(world, body)
    assert all(sharded for sharded, _ in results)
    for name, value in results[0][1].items():
        assert torch.equal(value, results[1][1][name]), name
    for options in ({"remote_device": "cpu"}, {"mpu": object()}, {"dtype": torch.bfloat16},
                    {"zero_quantized_weights": True}):
        with pytest.raises(zerort.UnimplementedError, match=next(iter(options))):
            deepspeed.zero.Init(comm=object(), **options)


def test_a_scripts_argument_parser_the_modules_attributes_and_deepspeeds_engine_calls():
    """deepspeed.add_config_arguments(parser) gives args that initialize(args=...) reads; the
    engine passes an attribute it does not have to the module (engine.generate, as
    DeepSpeed's; a method returning the module returns the engine); destroy() closes it;
    empty_partition_cache() is refused inside a micro-batch or a gathered() block, frees what
    an eval forward left gathered, and the next step trains on after it."""
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", "ds.json"])
    assert args.deepspeed and args.deepspeed_config == "ds.json" and not args.deepscale
    model = TinyLM()
    model.name_tag = "tiny"
    comm = zerort.local_group(1)[0]
    config = dict(DS_CONFIG, zero_optimization={"stage": 3,
                                                "stage3_param_persistence_threshold": 0})
    engine, _, _, _ = deepspeed.initialize(model=model, config=config, comm=comm)
    assert engine.name_tag == "tiny" and engine.train() is engine  # the module's, returning it
    assert torch.equal(engine.logits(batch(0)[0]), model.logits(batch(0)[0]))
    with pytest.raises(AttributeError, match="no_such_attribute"):
        engine.no_such_attribute
    loss = loss_of(model, *batch(0))
    with pytest.raises(zerort.FailedPreconditionError, match="after step"):
        engine.empty_partition_cache()
    engine.backward(loss)
    engine.step()
    with zerort.torch.gathered(list(model.parameters())):
        with pytest.raises(zerort.FailedPreconditionError, match="gathered"):
            engine.empty_partition_cache()
    engine.empty_partition_cache()
    with torch.no_grad():  # an eval forward: the engine prefetched the backward's units
        loss_of(model, *batch(2))
    assert engine.memory_stats()["gathered"][0] > 0
    engine.empty_partition_cache()
    assert engine.memory_stats()["gathered"][0] == 0
    engine.backward(loss_of(model, *batch(1)))
    engine.step()
    engine.destroy()
    assert engine.closed
    comm.close()


def test_deepspeed_comm_answers_ranks_from_the_launcher_and_is_torch_distributed(monkeypatch):
    """`import deepspeed.comm as dist` becomes `from zerort.torch.deepspeed import comm as
    dist`: get_rank(), get_world_size() and get_local_rank() answer from the launcher before
    any group is set up (0 of 1 for a process started alone); the collectives are
    torch.distributed's; a name neither has is named."""
    from zerort.torch.deepspeed import comm as dist
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE",
                 "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                 "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not dist.is_initialized()
    assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank()) == (0, 1, 0)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "5")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "7")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank()) == (5, 7, 1)
    assert deepspeed.comm is dist and deepspeed.init_distributed is dist.init_distributed
    assert dist.all_reduce is torch.distributed.all_reduce and dist.ReduceOp.SUM is not None
    with pytest.raises(AttributeError, match="log_summary"):
        dist.log_summary()
