"""engine.optimizer, param groups and learning-rate schedules against single-process PyTorch.

The ranks are threads (zerort.local_group); the reference is one plain PyTorch model trained
on the whole batch with torch.optim.AdamW over the same param groups. Params must agree to a
relative error of 1e-5 and learning rates to float32 precision.
"""
import math
import warnings

import pytest
import torch

import zerort
import zerort.torch
from test_torch_engine import (BATCH, OPTIMIZER, STEPS, TinyLM, assert_close, batch,
                               loss_of, run_ranks)

WEIGHT_LR, OTHER_LR = 0.01, 0.02


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def param_groups(model):
    """Two groups, as usual for transformers: weights with weight decay 0.1, biases and
    LayerNorm params without, each with its own lr."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            plain = name.endswith("bias") or ".norm." in name
            (no_decay if plain else decay).append(param)
    return [{"params": decay, "lr": WEIGHT_LR, "weight_decay": 0.1},
            {"params": no_decay, "lr": OTHER_LR, "weight_decay": 0.0}]


def warmup_then_decay(step):
    """LambdaLR's factor: a linear warmup over 3 steps, then exponential decay."""
    return (step + 1) / 3 if step < 3 else 0.8 ** (step - 2)


def lambda_lr(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_decay)


def trained(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def reference(make_scheduler=None, lrs_at=None, steps=STEPS, clip=None, grad_norms=None):
    """Single-process PyTorch AdamW over param_groups() on the whole batch. Each step's lr
    per group comes from `make_scheduler(optimizer)` (stepped after each optimizer step)
    or from `lrs_at(step)`; `clip`: torch.nn.utils.clip_grad_norm_'s max norm. Returns the
    params and each step's lrs; appends each step's gradient norm to `grad_norms`."""
    model = TinyLM()
    optimizer = torch.optim.AdamW(param_groups(model), betas=OPTIMIZER["betas"],
                                  eps=OPTIMIZER["eps"])
    scheduler = make_scheduler(optimizer) if make_scheduler else None
    lrs = []
    for step in range(steps):
        if lrs_at is not None:
            for group, lr in zip(optimizer.param_groups, lrs_at(step)):
                group["lr"] = lr
        lrs.append([group["lr"] for group in optimizer.param_groups])
        optimizer.zero_grad()
        loss_of(model, *batch(step)).backward()
        params = [p for p in model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip else float("inf"))
        if grad_norms is not None:
            grad_norms.append(norm.item())
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return trained(model), lrs


def config_for(stage, **extra):
    return dict({"stage": stage, "optimizer": OPTIMIZER, "stage3": {"persistence_threshold": 0},
                 "buckets": {"first_bucket_elems": 64, "reduce_bucket_elems": 256},
                 "guard": {"timeout_s": 30}}, **extra)


def train(world, config, steps=range(STEPS), groups=True, make_scheduler=None, load=None,
          save=None, loop="engine", check=None):
    """Trains TinyLM on `world` in-process ranks with param_groups() (groups=True) and an
    optional PyTorch scheduler on engine.optimizer; optionally loads a checkpoint first (and
    the scheduler's state from its client_state) and saves one after. `loop`: "engine"
    (loss.backward(); engine.step()) or "optimizer" (engine.optimizer.step() and
    zero_grad(), as a loop ported from PyTorch). `check(engine, step)` runs before each step.
    Returns per rank (params, each step's engine.get_lr())."""
    models = [TinyLM() for _ in range(world)]
    bounds = [BATCH * r // world for r in range(world + 1)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(
            model, config, comm, model_parameters=param_groups(model) if groups else None)
        scheduler = make_scheduler(engine.optimizer) if make_scheduler else None
        if load is not None:
            _, client_state = engine.load_checkpoint(load)
            assert client_state["next_step"] == steps[0]
            if scheduler is not None:
                scheduler.load_state_dict(client_state["scheduler"])
        rows = slice(bounds[rank], bounds[rank + 1])
        weight = (bounds[rank + 1] - bounds[rank]) * world / BATCH
        lrs = []
        for step in steps:
            if check is not None:
                check(engine, step)
            lrs.append(engine.get_lr())
            tokens, targets = batch(step)
            (weight * loss_of(model, tokens[rows], targets[rows])).backward()
            if loop == "engine":
                engine.step()
            else:
                engine.optimizer.step()
                engine.optimizer.zero_grad()
            if scheduler is not None:
                scheduler.step()
        if save is not None:
            engine.save_checkpoint(save, client_state={
                "next_step": steps[-1] + 1,
                "scheduler": scheduler.state_dict() if scheduler else None})
        engine.close()
        return trained(model), lrs

    return run_ranks(world, body)


def assert_lrs_close(got, want):
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        assert g == pytest.approx(w, rel=1e-6, abs=1e-12), f"step {step}: {g} != {w}"


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_param_groups_and_lambda_lr_match_pytorch(stage, world):
    """Two groups (lr and weight decay of their own) and LambdaLR on engine.optimizer equal
    torch.optim.AdamW with the same groups and LambdaLR on the whole batch."""
    want, want_lrs = reference(lambda_lr)
    for got, lrs in train(world, config_for(stage), make_scheduler=lambda_lr):
        assert_close(got, want)
        assert_lrs_close(lrs, want_lrs)


def test_groups_change_the_result():
    """The comparison above can fail: without the groups' own values the result differs."""
    want, _ = reference(lambda_lr)
    (got, _), = train(1, config_for(2), groups=False, make_scheduler=lambda_lr)
    with pytest.raises(AssertionError):
        assert_close(got, want)


def test_optimizer_is_a_torch_optimizer_with_the_engines_groups():
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, config_for(2), comm,
                                     model_parameters=param_groups(model))
    optimizer = engine.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert len(optimizer.param_groups) == 2
    decay, plain = optimizer.param_groups
    assert decay["params"][0] is model.blocks[0].lora_a.weight
    assert any(p is model.head.bias for p in plain["params"])
    assert (decay["lr"], decay["weight_decay"]) == (WEIGHT_LR, 0.1)
    assert (plain["lr"], plain["weight_decay"]) == (OTHER_LR, 0.0)
    assert plain["betas"] == tuple(OPTIMIZER["betas"]) and plain["eps"] == OPTIMIZER["eps"]
    assert optimizer.defaults["lr"] == OPTIMIZER["lr"]
    assert engine.get_lr() == [WEIGHT_LR, OTHER_LR]
    assert engine.lr_scheduler is None
    with pytest.raises(zerort.UnimplementedError, match="model_parameters"):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    with pytest.warns(UserWarning, match="engine.save_checkpoint"):  # no moments in it
        state = optimizer.state_dict()
    assert [g["lr"] for g in state["param_groups"]] == [WEIGHT_LR, OTHER_LR]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        optimizer.load_state_dict(state)
    engine.close()
    comm.close()


def test_a_step_made_by_torchs_grad_scaler_is_refused_and_changes_nothing():
    """torch's GradScaler hands its scale to an optimizer that takes it: as the grad_scaler
    keyword (PyTorch 1.x) or the found_inf and grad_scale attributes (2.x); a real scaler
    where this PyTorch has one for the CPU (torch.amp.GradScaler("cpu"), 2.3 and later)."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, config_for(2), comm)
    optimizer = engine.optimizer
    before = [p.detach().clone() for p in model.parameters()]
    loss_of(model, *batch(0)).backward()
    with pytest.raises(zerort.InvalidArgumentError, match="GradScaler.*engine.backward"):
        optimizer.step(grad_scaler=object())
    optimizer.found_inf, optimizer.grad_scale = torch.zeros(()), torch.ones(())
    with pytest.raises(zerort.InvalidArgumentError, match="GradScaler"):
        optimizer.step()
    assert not hasattr(optimizer, "found_inf") and not hasattr(optimizer, "grad_scale")
    with pytest.raises(TypeError, match="'scale'"):
        optimizer.step(scale=2.0)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler("cpu")
        with pytest.raises(zerort.InvalidArgumentError, match="GradScaler"):
            scaler.step(optimizer)
    optimizer.step()  # the micro-batch's gradients were held: it steps once asked plainly
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    engine.close()
    comm.close()


def test_a_refused_group_value_steps_once_put_right():
    """An lr schedule run past its end gave a negative lr: the step is refused naming the
    group, and once the value is put right the same step() goes through (every later call
    said "call Step() first", also step() itself)."""
    comms = [zerort.local_group(1)[0] for _ in range(2)]
    models = [TinyLM(), TinyLM()]
    engines = [zerort.torch.initialize(m, config_for(2), c) for m, c in zip(models, comms)]
    for engine, model in zip(engines, models):
        loss_of(model, *batch(0)).backward()
    engines[0].optimizer.param_groups[0]["lr"] = -0.01
    with pytest.raises(zerort.InvalidArgumentError) as raised:
        engines[0].step()
    assert "param_groups[0]" in str(raised.value) and "-0.01" in str(raised.value)
    engines[0].optimizer.param_groups[0]["lr"] = None  # not even a number
    with pytest.raises(TypeError):
        engines[0].step()
    engines[0].optimizer.param_groups[0]["lr"] = engines[1].optimizer.param_groups[0]["lr"]
    for engine in engines:
        engine.step()
    assert_close(trained(models[0]), trained(models[1]))
    for engine, comm in zip(engines, comms):
        engine.close()
        comm.close()


def test_torch_options_that_change_the_step_are_refused_by_load_state_dict_and_step():
    """A torch AdamW state dict with amsgrad=True (or a hand edit to maximize=True) was
    taken and shown in param_groups while the engine went on without it."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, config_for(2), comm)
    plain = TinyLM()
    state = torch.optim.AdamW(plain.parameters(), lr=0.003, amsgrad=True).state_dict()
    lr = engine.optimizer.param_groups[0]["lr"]
    with pytest.raises(zerort.UnimplementedError, match="amsgrad=True"):
        engine.optimizer.load_state_dict(state)
    assert engine.optimizer.param_groups[0]["lr"] == lr  # nothing loaded
    engine.optimizer.param_groups[0]["maximize"] = True
    loss_of(model, *batch(0)).backward()
    with pytest.raises(zerort.UnimplementedError, match="maximize=True"):
        engine.step()
    del engine.optimizer.param_groups[0]["maximize"]
    engine.step()
    # Newer PyTorch's AdamW is Adam(decoupled_weight_decay=True): an AdamW engine takes it.
    state = engine.optimizer.state_dict()
    for group in state["param_groups"]:
        group["decoupled_weight_decay"] = True
    engine.optimizer.load_state_dict(state)
    engine.close()
    comm.close()


def test_setting_the_loss_scale_by_hand_is_refused():
    """engine.loss_scale = 1.0 under a static scale of 128 scaled the loss by 1 while the
    step divided by 128: updates 128 times too small, silently."""
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(TinyLM(), config_for(
        2, loss_scale={"mode": "static", "initial_power": 7}), comm)
    assert engine.loss_scale == 128.0
    engine.loss_scale = 128.0  # its own value: nothing changes
    with pytest.raises(zerort.FailedPreconditionError, match="loss_scale.mode"):
        engine.loss_scale = 1.0
    assert engine.loss_scale == 128.0
    engine.close()
    comm.close()


def test_sgd_groups_show_momentum_dampening_and_nesterov():
    comm = zerort.local_group(1)[0]
    config = {"stage": 1, "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9,
                                        "nesterov": True}}
    engine = zerort.torch.initialize(TinyLM(), config, comm)
    group, = engine.optimizer.param_groups
    assert (group["lr"], group["momentum"], group["dampening"], group["nesterov"]) == (
        0.1, 0.9, 0.0, True)
    assert "betas" not in group and "momentum" in engine.optimizer.defaults
    engine.close()
    comm.close()


def test_changed_group_values_reach_the_engine():
    """A value set in param_groups between steps is the engine's for the next step."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, config_for(2), comm,
                                     model_parameters=param_groups(model))
    loss_of(model, *batch(0)).backward()
    engine.step()
    engine.optimizer.param_groups[1]["weight_decay"] = 0.25
    engine.optimizer.param_groups[1]["betas"] = (0.8, 0.99)
    engine.optimizer.param_groups[0]["lr"] = 0.5
    loss_of(model, *batch(1)).backward()
    engine.step()
    assert engine.engine.group_hyper(1)["weight_decay"] == pytest.approx(0.25)
    assert engine.engine.group_hyper(1)["beta1"] == pytest.approx(0.8)
    assert engine.engine.lr(0) == pytest.approx(0.5)
    assert engine.optimizer.param_groups[0]["lr"] == 0.5  # the user's value, not read back
    engine.close()
    comm.close()


@pytest.mark.parametrize("loop", ["engine", "optimizer"])
def test_no_scheduler_order_warning_and_optimizer_step_loop(loop):
    """The usual loop (engine.step() or engine.optimizer.step(), then scheduler.step())
    raises no "lr_scheduler.step() before optimizer.step()" warning, and a loop ported from
    PyTorch (optimizer.step(); optimizer.zero_grad()) trains like PyTorch."""
    want, want_lrs = reference(lambda_lr)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (got, lrs), = train(1, config_for(2), make_scheduler=lambda_lr, loop=loop)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "lr_scheduler" in m], messages
    assert_close(got, want)
    assert_lrs_close(lrs, want_lrs)


def test_scheduler_order_warning_is_real():
    """The check above can fail: a scheduler stepped with no optimizer step warns."""
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(TinyLM(), config_for(2), comm)
    scheduler = lambda_lr(engine.optimizer)
    with pytest.warns(UserWarning, match="lr_scheduler.step()"):
        scheduler.step()
    engine.close()
    comm.close()


def one_cycle(optimizer):
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[0.02, 0.04],
                                               total_steps=STEPS, pct_start=0.3)


def test_one_cycle_lr_cycles_lr_and_beta1_as_in_pytorch():
    """OneCycleLR changes each group's lr and betas[0] every step; the engine follows."""
    want, want_lrs = reference(one_cycle)
    for got, lrs in train(2, config_for(2), make_scheduler=one_cycle):
        assert_close(got, want)
        assert_lrs_close(lrs, want_lrs)


def sgd_groups(model, momentum):
    """param_groups() for SGD: the weights' group with `momentum`, the others without."""
    groups = param_groups(model)
    groups[0]["momentum"] = momentum
    return groups


def sgd_one_cycle(optimizer):
    """OneCycleLR cycles SGD's momentum between 0.85 and 0.95 (cycle_momentum)."""
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=STEPS,
                                               pct_start=0.3)


@pytest.mark.parametrize("stage", [0, 2, 3])
@pytest.mark.parametrize("scheduled", [False, True])
def test_sgd_momentum_of_a_group_or_turned_on_later_matches_pytorch(stage, scheduled):
    """SGD whose own momentum is 0: a param group with momentum (model_parameters), or
    OneCycleLR turning it on for every group after initialize, trains as torch.optim.SGD
    (each step failed: the engine kept no momentum buffer). Dampening 0.1 shows each
    buffer starting from the gradient at its first step with momentum, as torch's."""
    momentum = 0.0 if scheduled else 0.9
    model = TinyLM()
    optimizer = torch.optim.SGD(sgd_groups(model, momentum), lr=0.05, dampening=0.1)
    scheduler = sgd_one_cycle(optimizer) if scheduled else None
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, *batch(step)).backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    want = trained(model)
    models = [TinyLM() for _ in range(2)]
    config = config_for(stage, optimizer={"type": "sgd", "lr": 0.05, "momentum": 0.0,
                                          "dampening": 0.1, "weight_decay": 0.0})

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm,
                                         model_parameters=sgd_groups(model, momentum))
        scheduler = sgd_one_cycle(engine.optimizer) if scheduled else None
        rows = slice(BATCH * rank // 2, BATCH * (rank + 1) // 2)
        for step in range(STEPS):
            tokens, targets = batch(step)
            loss_of(model, tokens[rows], targets[rows]).backward()
            engine.step()
            if scheduler is not None:
                scheduler.step()
        engine.close()
        return trained(model)

    for got in run_ranks(2, body):
        assert_close(got, want)


def test_sequential_lr_with_cosine_annealing():
    def sequential(optimizer):
        lr_scheduler = torch.optim.lr_scheduler
        return lr_scheduler.SequentialLR(optimizer, [
            lr_scheduler.LinearLR(optimizer, start_factor=0.2, total_iters=3),
            lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS - 3)], milestones=[3])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SequentialLR's own deprecation notes on some versions
        want, want_lrs = reference(sequential)
        for got, lrs in train(2, config_for(1), make_scheduler=sequential):
            assert_close(got, want)
            assert_lrs_close(lrs, want_lrs)


# DeepSpeed's schedules, transcribed from deepspeed/runtime/lr_schedules.py (WarmupLR,
# WarmupDecayLR, WarmupCosineLR), independently of the library: the lr each group holds
# while the schedule is at `iteration` (DeepSpeed's last_batch_iteration; -1 before the
# first step, +1 after each applied optimizer step).
def deepspeed_lrs(kind, params, base_lrs, iteration):
    warmup = max(2, params.get("warmup_num_steps", 1000))
    log_warmup = params.get("warmup_type", "log") == "log"

    def warmup_gamma():
        if log_warmup:
            return math.log(iteration + 1) / math.log(warmup)
        return iteration / warmup

    if kind in ("WarmupLR", "WarmupDecayLR"):
        low, high = params.get("warmup_min_lr", 0.0), params.get("warmup_max_lr", 0.001)
        if iteration < 0:
            return [low] * len(base_lrs)
        if iteration < warmup:
            gamma = warmup_gamma()
        elif kind == "WarmupLR":
            gamma = 1.0
        else:
            total = params["total_num_steps"]
            gamma = max(0.0, (total - iteration) / max(1.0, total - warmup))
        return [low + (high - low) * gamma] * len(base_lrs)
    assert kind == "WarmupCosineLR"
    if iteration < 0:
        return [0.0] * len(base_lrs)
    if iteration < warmup:
        low = params.get("warmup_min_ratio", 0.0)
        ratio = low + warmup_gamma() * (1.0 - low)
    else:
        floor = params.get("cos_min_ratio", 0.0001)
        progress = min(1.0, (iteration - warmup + 1) / max(1, params["total_num_steps"] - warmup))
        ratio = max(0.0, floor + (1.0 - floor) * (1 + math.cos(math.pi * progress)) / 2)
    return [lr * ratio for lr in base_lrs]


SCHEDULES = {
    "WarmupLR": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.02, "warmup_num_steps": 5,
                 "warmup_type": "log"},
    "WarmupDecayLR": {"total_num_steps": STEPS, "warmup_min_lr": 0.002,
                      "warmup_max_lr": 0.03, "warmup_num_steps": 4, "warmup_type": "linear"},
    "WarmupCosineLR": {"total_num_steps": STEPS, "warmup_num_steps": 3,
                       "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01, "warmup_type": "linear"},
}


def scheduled_config(stage, kind):
    return config_for(stage, scheduler={"type": kind, "params": SCHEDULES[kind]})


def schedule_reference(kind):
    """AdamW with step k's lrs DeepSpeed's at iteration k - 1."""
    return reference(lrs_at=lambda step: deepspeed_lrs(kind, SCHEDULES[kind],
                                                      [WEIGHT_LR, OTHER_LR], step - 1))


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_builtin_schedule_matches_deepspeeds_formulas(kind):
    want, want_lrs = schedule_reference(kind)
    positions = []

    def check(engine, step):
        scheduler = engine.lr_scheduler
        positions.append(scheduler.last_batch_iteration)
        # The engine's lrs, read back into param_groups after each step.
        assert scheduler.get_lr() == scheduler.get_last_lr()
        assert engine.get_lr() == pytest.approx(scheduler.get_lr(), rel=1e-7)
        assert scheduler.state_dict() == {"last_batch_iteration": step - 1}
        scheduler.step()  # does nothing: the engine steps the schedule

    (got, lrs), = train(1, scheduled_config(2, kind), check=check)
    assert positions == list(range(-1, STEPS - 1))
    assert_lrs_close(lrs, want_lrs)
    assert_close(got, want)


def test_schedules_differ():
    """The comparisons above can fail: the schedules give other lrs than the constant one."""
    for kind in SCHEDULES:
        _, lrs = schedule_reference(kind)
        assert len({tuple(step) for step in lrs}) > 3, kind


def test_builtin_scheduler_object():
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, scheduled_config(2, "WarmupLR"), comm)
    scheduler = engine.lr_scheduler
    assert scheduler.type == "WarmupLR" and scheduler.last_batch_iteration == -1
    assert scheduler.get_lr() == [pytest.approx(0.001)]
    loss_of(model, *batch(0)).backward()
    engine.step()
    assert scheduler.last_batch_iteration == 0
    scheduler.load_state_dict({"last_batch_iteration": 0})  # the same position: fine
    with pytest.raises(zerort.FailedPreconditionError, match="load_checkpoint"):
        scheduler.load_state_dict({"last_batch_iteration": 5})
    engine.close()
    comm.close()


@pytest.mark.parametrize("stage", [1, 3])
def test_builtin_schedule_resumes_at_another_world_size(tmp_path, stage):
    """Saved mid-schedule at 2 ranks, resumed at 3: the same params and lrs as the
    uninterrupted run."""
    kind = "WarmupCosineLR"
    want, want_lrs = schedule_reference(kind)
    half = STEPS // 2
    first = train(2, scheduled_config(2, kind), steps=range(half), save=tmp_path / "ckpt")
    for got, lrs in train(3, scheduled_config(stage, kind), steps=range(half, STEPS),
                          load=tmp_path / "ckpt"):
        assert_close(got, want)
        assert_lrs_close(first[0][1] + lrs, want_lrs)


def test_lambda_lr_resumes_at_another_world_size(tmp_path):
    """A PyTorch scheduler's state travels in client_state; the groups' values (the lr it
    set after the last step) in the checkpoint."""
    want, want_lrs = reference(lambda_lr)
    half = STEPS // 2
    first = train(2, config_for(2), steps=range(half), make_scheduler=lambda_lr,
                  save=tmp_path / "ckpt")
    for got, lrs in train(3, config_for(2), steps=range(half, STEPS),
                          make_scheduler=lambda_lr, load=tmp_path / "ckpt"):
        assert_close(got, want)
        assert_lrs_close(first[0][1] + lrs, want_lrs)


def test_global_grad_norm_is_the_whole_batchs():
    """engine.get_global_grad_norm() is the norm over every rank's gradient, and so is what
    torch.nn.utils.clip_grad_norm_ over the model returns (through the engine, which holds
    the gradients; max_norm inf reads it without clipping)."""
    norms = []
    reference(steps=1, grad_norms=norms)
    models = [TinyLM() for _ in range(2)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config_for(2), comm)
        assert engine.get_global_grad_norm() is None
        rows = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
        tokens, targets = batch(0)
        loss_of(model, tokens[rows], targets[rows]).backward()
        params = [p for p in model.parameters() if p.requires_grad]
        clipped = torch.nn.utils.clip_grad_norm_(params, float("inf")).item()
        engine.step()
        norm = engine.get_global_grad_norm()
        assert engine.global_steps == 1
        engine.close()
        return norm, clipped

    for norm, clipped in run_ranks(2, body):
        assert norm == clipped == pytest.approx(norms[0], rel=1e-5)


def test_step_info_reads_a_norm_left_on_the_gpu_once_and_only_for_its_step():
    """engine.step()'s info is a mapping; a norm the step left on the device is read on
    first access and kept; first read after a later step, it is None with a warning, never
    the later step's norm; a NaN norm on the host is just NaN."""
    from zerort.torch import _step_info
    reads = []
    current = [1]

    def read():
        reads.append(current[0])
        return 2.5

    info = _step_info.StepInfo({"step": 1, "skipped": False, "grad_norm": float("nan"),
                                "loss_scale": 1.0}, True, 1, read, lambda: current[0])
    assert "<on the GPU>" in repr(info)
    assert sorted(info) == ["grad_norm", "loss_scale", "skipped", "step"]
    assert info["grad_norm"] == 2.5 and info["grad_norm"] == 2.5
    assert reads == [1]
    assert dict(info)["grad_norm"] == 2.5
    late = _step_info.StepInfo({"step": 2, "skipped": False, "grad_norm": float("nan"),
                                "loss_scale": 1.0}, True, 2, read, lambda: current[0])
    current[0] = 3
    assert "grad_norm" in late
    with pytest.warns(UserWarning, match="sync_grad_norm"):
        assert late.get("grad_norm") is None
    assert dict(late)["grad_norm"] is None and reads == [1]
    on_host = _step_info.StepInfo({"step": 1, "skipped": True, "grad_norm": float("nan"),
                                   "loss_scale": 1.0}, False, 1, read, lambda: current[0])
    assert math.isnan(on_host["grad_norm"]) and reads == [1]
    assert "<on the GPU>" not in repr(on_host)


def test_the_engines_last_grad_norm_is_the_steps():
    """zerort.torch leaves sync_grad_norm off; on the CPU the norm is on the host anyway, and
    the engine's last_grad_norm() agrees with the step's info."""
    model = TinyLM()
    engine = zerort.torch.initialize(model, config_for(2), zerort.local_group(1)[0])
    assert engine.config["sync_grad_norm"] is False
    tokens, targets = batch(0)
    loss_of(model, tokens, targets).backward()
    info = engine.step()
    assert math.isfinite(info["grad_norm"]) and info["grad_norm"] > 0
    assert engine._engine.last_grad_norm() == info["grad_norm"]
    assert engine.get_global_grad_norm() == info["grad_norm"]
    engine.close()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_an_lr_changed_on_one_rank_is_refused_and_the_step_can_be_retried(stage):
    """A scheduler stepped on rank 0 only: step() is refused on every rank, naming the group
    and the setting, with nothing changed; once the ranks agree the same step goes ahead."""
    models = [TinyLM() for _ in range(2)]
    config = {"stage": stage, "optimizer": OPTIMIZER, "guard": {"timeout_s": 20}}

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        before = {n: v.clone() for n, v in engine.state_dict().items()}
        if rank == 0:
            engine.optimizer.param_groups[0]["lr"] *= 0.5
        loss_of(model, *batch(0)).backward()
        with pytest.raises(zerort.FailedPreconditionError, match="group 0's lr is 0.005"):
            engine.step()
        assert engine.global_steps == 0
        assert all(torch.equal(v, before[n]) for n, v in engine.state_dict().items())
        engine.optimizer.param_groups[0]["lr"] = OPTIMIZER["lr"]
        engine.step()
        assert engine.global_steps == 1 and engine.was_step_applied()
        after = engine.state_dict()
        engine.close()
        return after

    first, second = run_ranks(2, body)
    assert_close(first, second)


def test_param_groups_show_the_engines_float32_values_as_their_shortest_decimals():
    """Values the config set (defaults the user never gave, a config scheduler's lr) read as
    DeepSpeed shows them: betas (0.9, 0.999) and eps 1e-08, not 0.8999999761581421."""
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(TinyLM(), {
        "zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
        "scheduler": {"type": "WarmupLR", "params": {
            "warmup_num_steps": 3, "warmup_max_lr": 0.03, "warmup_type": "linear"}}}, comm)
    group = engine.optimizer.param_groups[0]
    assert (group["betas"], group["eps"]) == ((0.9, 0.999), 1e-08)
    for step in range(4):
        engine.backward(loss_of(engine.module, *batch(step)))
        engine.step()
        lr = group["lr"]
        assert lr == float(f"{lr:.7g}") and engine.get_lr() == [lr], lr
        assert engine.lr_scheduler.get_lr() == [lr] == engine.lr_scheduler.get_last_lr()
    assert lr == 0.03  # warmed up
    engine.close()
