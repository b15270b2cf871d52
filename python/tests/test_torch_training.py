"""The training loop's other parts against single-process PyTorch: engine.backward with
gradient accumulation, bf16 params with fp32 accumulation, a DeepSpeed config, all_reduce,
client_state in checkpoints, and the errors that name a loop's mistakes. The ranks are
threads (zerort.local_group)."""
import copy
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import zerort
import zerort.torch
from test_torch_engine import (BATCH, OPTIMIZER, TinyLM, assert_close, batch, cpu_supports,
                               loss_of, run_ranks, stored_in)
from test_torch_optimizer import deepspeed_lrs

STEPS = 6
SGD = {"type": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def trained(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def sgd_reference(steps=STEPS):
    """PyTorch SGD (momentum 0.9) on the whole batch: unlike Adam's, its step is
    proportional to the gradient, so a loss scaled wrongly shows."""
    model = TinyLM()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad],
                                lr=SGD["lr"], momentum=SGD["momentum"])
    for step in range(steps):
        optimizer.zero_grad()
        loss_of(model, *batch(step)).backward()
        optimizer.step()
    return trained(model)


@pytest.mark.parametrize("loss_scale", [None, {"mode": "static", "initial_power": 4}])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_engine_backward_with_four_micro_batches_matches_pytorch(stage, loss_scale):
    """gradient_accumulation_steps 4: each rank's 4 rows as 4 micro-batches of one row;
    engine.backward(loss) scales by the loss scale and divides by 4, as DeepSpeed's."""
    world, micro = 2, 4
    config = {"stage": stage, "optimizer": SGD, "gradient_accumulation_steps": micro,
              "stage3": {"persistence_threshold": 0}, "guard": {"timeout_s": 30}}
    if loss_scale:
        config["loss_scale"] = loss_scale
    models = [TinyLM() for _ in range(world)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        assert engine.gradient_accumulation_steps == micro and engine.world_size == world
        assert engine.loss_scale == (16.0 if loss_scale else 1.0)
        for step in range(STEPS):
            tokens, targets = (t[rank * 4:(rank + 1) * 4] for t in batch(step))
            infos = []
            for row in range(micro):
                engine.backward(loss_of(model, tokens[row:row + 1], targets[row:row + 1]))
                infos.append(engine.step())
            assert infos[:3] == [None] * 3 and infos[3]["step"] == step + 1
        assert engine.global_steps == STEPS
        engine.close()
        return trained(model)

    want = sgd_reference()
    for got in run_ranks(world, body):
        assert_close(got, want)


@pytest.mark.parametrize("scaled_by", [None, "backward", "scale"])
def test_a_loss_left_unscaled_under_loss_scaling_is_named_once(scaled_by):
    """With a loss scale, `loss.backward()` gives gradients the step divides by the scale
    all the same (the params barely move): a warning says so, once; engine.backward(loss) and
    engine.scale(loss).backward() scale it and say nothing."""
    model = TinyLM()
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(model, {
        "stage": 2, "optimizer": SGD, "loss_scale": {"mode": "static", "initial_power": 4}}, comm)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            loss = loss_of(model, *batch(step))
            if scaled_by == "backward":
                engine.backward(loss)
            elif scaled_by == "scale":
                engine.scale(loss).backward()
            else:
                loss.backward()
            engine.step()
    unscaled = [w for w in caught if "was not scaled" in str(w.message)]
    assert len(unscaled) == (1 if scaled_by is None else 0)
    if unscaled:
        assert "engine.backward(loss)" in str(unscaled[0].message)
    engine.close()
    comm.close()


def bf16_ulps(a, b):
    """Elementwise distance between two bf16 tensors in units in the last place."""
    def ordered(x):
        bits = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)
    return (ordered(a) - ordered(b)).abs()


# Each rank's micro-batches: (rows of its share, loss weight). The first and third cancel
# exactly (the same rows, weights ±32, bf16 gradients that are each other's negation), so the
# step's gradient is the mean over the rank's rows, but a sum kept in bf16 loses the second
# micro-batch under the first's 64 times larger values.
MICRO_BATCHES = [(slice(0, 2), 32.0), (slice(0, 2), 0.5), (slice(0, 2), -32.0),
                 (slice(2, 4), 0.5)]


def bf16_model():
    if cpu_supports(torch.bfloat16):
        return TinyLM().to(torch.bfloat16)
    return stored_in(TinyLM(), torch.bfloat16)


def bf16_params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()
            if p.requires_grad and p.dtype == torch.bfloat16}


def bf16_reference(accumulate_in, steps=STEPS, world=2):
    """PyTorch AdamW on fp32 copies of bf16 params, the params rounded to bf16 after each
    step. Each rank's micro-batch gradients are computed as the engine's ranks compute them
    (bf16, on the rank's rows) and summed in `accumulate_in`; the ranks' sums are averaged
    in fp32."""
    model = bf16_model()
    params = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().float().clone().requires_grad_() for p in params]
    optimizer = torch.optim.AdamW(masters, lr=OPTIMIZER["lr"], betas=OPTIMIZER["betas"],
                                  eps=OPTIMIZER["eps"], weight_decay=OPTIMIZER["weight_decay"])
    share = BATCH // world
    for step in range(steps):
        tokens, targets = batch(step)
        total = [torch.zeros_like(m) for m in masters]
        for rank in range(world):
            mine = slice(rank * share, (rank + 1) * share)
            sums = [torch.zeros_like(p, dtype=accumulate_in) for p in params]
            for rows, weight in MICRO_BATCHES:
                for p in params:
                    p.grad = None
                (weight * loss_of(model, tokens[mine][rows], targets[mine][rows])).backward()
                for s, p in zip(sums, params):
                    s.add_(p.grad.to(accumulate_in))
            for t, s in zip(total, sums):
                t.add_(s.float())
        for m, t in zip(masters, total):
            m.grad = t / world
        optimizer.step()
        with torch.no_grad():
            for p, m in zip(params, masters):
                p.copy_(m.to(torch.bfloat16))
    return bf16_params(model)


@pytest.mark.parametrize("precision,close", [
    (None, True), ({"param": "bf16", "grad": "bf16", "reduce": "bf16"}, False)])
def test_bf16_params_accumulate_in_fp32_by_default(precision, close):
    """bf16 params, no precision keys: micro-batches are summed in fp32; the result is within
    2 bf16 ulps of PyTorch on fp32 masters with fp32 sums, and a bf16 sum (PyTorch's, or the
    engine's with precision.grad "bf16") is not."""
    world = 2
    config = {"stage": 2, "optimizer": OPTIMIZER, "gradient_accumulation_steps": 4,
              "guard": {"timeout_s": 30}}
    if precision is not None:
        config["precision"] = precision
    models = [bf16_model() for _ in range(world)]
    share = BATCH // world

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        for step in range(STEPS):
            tokens, targets = (t[rank * share:(rank + 1) * share] for t in batch(step))
            for rows, weight in MICRO_BATCHES:
                (weight * loss_of(model, tokens[rows], targets[rows])).backward()
                engine.step()
        engine.close()
        return bf16_params(model)

    want = bf16_reference(torch.float32)
    for got in run_ranks(world, body):
        worst = {n: bf16_ulps(got[n], want[n]).max().item() for n in want}
        if close:
            assert max(worst.values()) <= 2, f"bf16 ulps from the fp32-sum reference: {worst}"
        else:
            assert max(worst.values()) > 2
    in_bf16 = bf16_reference(torch.bfloat16)
    assert max(bf16_ulps(in_bf16[n], want[n]).max().item() for n in want) > 2


@pytest.mark.parametrize("stage", [0, 1, 2])
@pytest.mark.parametrize("write", ["load_state_dict", "copy_"])
@pytest.mark.parametrize("via_method", [False, True])
def test_values_written_into_16_bit_params_reach_the_master(tmp_path, stage, write, via_method):
    """A 16-bit param's view is not what the optimizer steps from (the fp32 master is): values
    written in place after initialize() (pretrained weights loaded into the wrapped model)
    must survive the next steps and reach a checkpoint (its trainable params: frozen ones are
    saved only under checkpoint.save_frozen), not be overwritten from the master; also when
    the steps compute through another method than the model's forward (`via_method`: its
    hooks never run, the writes are taken at the step's first gradient)."""
    torch.manual_seed(1)
    written = {n: torch.randn_like(p) for n, p in bf16_model().named_parameters()}

    models = [bf16_model() for _ in range(2)]  # here: TinyLM seeds the shared RNG

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, {
            "stage": stage, "optimizer": {"type": "sgd", "lr": 0.0, "weight_decay": 0.0}}, comm)

        def write_values(values):
            if write == "load_state_dict":
                model.load_state_dict(values)
                return
            with torch.no_grad():
                for name, param in model.named_parameters():
                    param.copy_(values[name])

        write_values(written)
        for step in range(2):
            loss_of(model, *batch(step), via_method=via_method).backward()
            engine.step()
        after_steps = {n: p.detach().clone() for n, p in model.named_parameters()}
        halved = {n: v / 2 for n, v in written.items()}
        write_values(halved)  # between steps, then straight into a checkpoint
        engine.save_checkpoint(str(tmp_path / "ckpt"))
        write_values(written)
        engine.load_checkpoint(str(tmp_path / "ckpt"))
        loaded = {n: p.detach().clone() for n, p in model.named_parameters()
                  if p.requires_grad}
        engine.close()
        comm.close()
        return after_steps, loaded, halved

    for after_steps, loaded, halved in run_ranks(2, body):
        for name, values in written.items():
            assert torch.equal(after_steps[name], values), name
        assert loaded and all(torch.equal(loaded[n], halved[n]) for n in loaded)


def test_a_write_inside_a_micro_batch_is_not_taken_into_the_master():
    """A write between backward and step (here one that changes nothing, as a forward's own
    nn.Embedding(max_norm=...) renorm often does) is not taken: taking the view after the
    step would round the fp32 master to bf16 every step."""
    def run(write):
        models = [bf16_model() for _ in range(2)]  # here: TinyLM seeds the shared RNG

        def body(rank, comm):
            model = models[rank]
            engine = zerort.torch.initialize(model, {"stage": 1, "optimizer": SGD}, comm)
            for step in range(3):
                loss_of(model, *batch(step)).backward()
                if write:
                    with torch.no_grad():
                        for param in model.parameters():
                            param.mul_(1.0)
                engine.step()
            values = bf16_params(model)
            engine.close()
            comm.close()
            return values
        return run_ranks(2, body)[0]

    assert_close(run(True), run(False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_written_into_persistent_stage3_units_reach_the_engine(dtype):
    """Stage-3 units small enough to stay gathered are views of the engine's gathered copy,
    not of the shards the step updates: a load_state_dict() between steps reaches them."""
    models = [TinyLM() if dtype == torch.float32 else bf16_model() for _ in range(2)]

    def body(rank, comm):
        model = models[rank]  # built here: the ranks' threads share the RNG
        engine = zerort.torch.initialize(model, {
            "stage": 3, "optimizer": {"type": "sgd", "lr": 0.0},
            "stage3": {"persistence_threshold": 10**9}}, comm)
        loss_of(model, *batch(0)).backward()
        engine.step()
        written = {n: torch.full_like(p, 0.5) for n, p in model.named_parameters()}
        model.load_state_dict(written, strict=False)
        loss_of(model, *batch(1)).backward()
        engine.step()
        after = {n: p.detach().clone() for n, p in model.named_parameters()}
        engine.close()
        comm.close()
        return after, written

    for after, written in run_ranks(2, body):
        assert_close(after, written)


DEEPSPEED = {
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
    "optimizer": {"type": "Adam", "params": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8,
                                             "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.002, "warmup_max_lr": 0.01,
                                                 "warmup_num_steps": 4,
                                                 "warmup_type": "linear"}},
    "zero_optimization": {"stage": 2},
}


def deepspeed_reference(clip):
    """What DeepSpeed does with DEEPSPEED: AdamW (its Adam's adam_w_mode defaults to true)
    with WarmupLR's lr, gradients clipped to a global norm of `clip`, on the whole batch."""
    model = TinyLM()
    params = [p for p in model.parameters() if p.requires_grad]
    adam = DEEPSPEED["optimizer"]["params"]
    optimizer = torch.optim.AdamW(params, lr=adam["lr"], betas=adam["betas"], eps=adam["eps"],
                                  weight_decay=adam["weight_decay"])
    schedule = DEEPSPEED["scheduler"]
    lrs, norms = [], []
    for step in range(STEPS):
        lr, = deepspeed_lrs(schedule["type"], schedule["params"], [adam["lr"]], step - 1)
        optimizer.param_groups[0]["lr"] = lr
        lrs.append([lr])
        optimizer.zero_grad()
        loss_of(model, *batch(step)).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, clip).item())
        optimizer.step()
    return trained(model), lrs, norms


@pytest.mark.parametrize("form", ["dict", "text", "file"])
def test_deepspeed_config_drives_a_run(tmp_path, form):
    world = 2
    if form == "dict":
        config = DEEPSPEED
    elif form == "text":
        config = json.dumps(DEEPSPEED)
    else:
        config = tmp_path / "ds_config.json"
        config.write_text(json.dumps(DEEPSPEED))
        config = str(config)
    models = [TinyLM() for _ in range(world)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        assert engine.stage == 2 and engine.gradient_accumulation_steps == 2
        assert engine.lr_scheduler is not None
        lrs = []
        for step in range(STEPS):
            lrs.append(engine.get_lr())
            tokens, targets = (t[rank * 4:(rank + 1) * 4] for t in batch(step))
            for half in (slice(0, 2), slice(2, 4)):
                engine.backward(loss_of(model, tokens[half], targets[half]))
                engine.step()
        engine.close()
        return trained(model), lrs

    want, want_lrs, norms = deepspeed_reference(DEEPSPEED["gradient_clipping"])
    assert max(norms) > DEEPSPEED["gradient_clipping"]  # clipping changed the steps
    for got, lrs in run_ranks(world, body):
        assert_close(got, want)
        assert lrs == [[pytest.approx(lr, rel=1e-6)] for lr, in want_lrs]


def test_deepspeed_reference_depends_on_clipping():
    """The comparison above can fail: without clipping the params differ."""
    clipped, _, _ = deepspeed_reference(DEEPSPEED["gradient_clipping"])
    unclipped, _, _ = deepspeed_reference(float("inf"))
    with pytest.raises(AssertionError):
        assert_close(unclipped, clipped)


def test_deepspeed_accumulation_steps_are_derived_from_the_batch_sizes():
    """train_batch_size and train_micro_batch_size_per_gpu without gradient_accumulation_steps,
    or with it "auto": DeepSpeed derives it with the world size (16 / (4 × 2 ranks) = 2);
    sizes that do not divide are an error naming train_batch_size."""
    base = {"zero_optimization": {"stage": 1},
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}

    def accumulation(_rank, comm):
        steps = []
        for given in ({}, {"gradient_accumulation_steps": "auto"}):
            engine = zerort.torch.initialize(
                TinyLM(), dict(base, train_batch_size=16, train_micro_batch_size_per_gpu=4,
                               **given), comm)
            steps.append(engine.gradient_accumulation_steps)
            engine.close()
        comm.close()
        return steps

    assert run_ranks(2, accumulation) == [[2, 2], [2, 2]]

    def uneven(_rank, comm):
        with pytest.raises(zerort.InvalidArgumentError, match="train_batch_size 12"):
            zerort.torch.initialize(
                TinyLM(), dict(base, train_batch_size=12, train_micro_batch_size_per_gpu=4),
                comm)
        comm.close()

    run_ranks(2, uneven)


def test_unsupported_deepspeed_key_is_named():
    comm = zerort.local_group(1)[0]
    config = dict(DEEPSPEED, train_batch_size=4, train_micro_batch_size_per_gpu=2,
                  zero_optimization={"stage": 2, "offload_optimizer": {"device": "nvme"}})
    with pytest.raises(zerort.InvalidArgumentError, match="offload_optimizer"):
        zerort.torch.initialize(TinyLM(), config, comm)
    comm.close()


def test_missing_config_file_is_named(tmp_path):
    comm = zerort.local_group(1)[0]
    with pytest.raises(zerort.InvalidArgumentError, match="nowhere.json"):
        zerort.torch.initialize(TinyLM(), str(tmp_path / "nowhere.json"), comm)
    comm.close()


def test_all_reduce_sum_mean_max_min_on_three_ranks():
    world = 3

    def body(rank, comm):
        engine = zerort.torch.initialize(TinyLM(), {"stage": 1}, comm)
        values = torch.tensor([1.0 + rank, -2.0 * rank, 0.5], dtype=torch.float64)
        results = {}
        for op in ("sum", "mean", "max", "min"):
            tensor = values.clone()
            assert engine.all_reduce(tensor, op) is tensor
            results[op] = tensor
        half = torch.full((2, 2), float(rank), dtype=torch.bfloat16)
        results["bf16"] = engine.all_reduce(half, "mean")
        with pytest.raises(zerort.InvalidArgumentError, match="prod"):
            engine.all_reduce(values.clone(), "prod")
        with pytest.raises(zerort.InvalidArgumentError, match="floating"):
            engine.all_reduce(torch.ones(2, dtype=torch.int64))
        engine.close()
        return results

    for results in run_ranks(world, body):
        assert results["sum"].tolist() == [6.0, -6.0, 1.5]
        assert results["mean"].tolist() == [2.0, -2.0, 0.5]
        assert results["max"].tolist() == [3.0, 0.0, 0.5]
        assert results["min"].tolist() == [1.0, -4.0, 0.5]
        assert results["sum"].dtype == torch.float64
        assert results["bf16"].dtype == torch.bfloat16
        assert results["bf16"].tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_client_state_with_rng_states_round_trips(tmp_path):
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": OPTIMIZER}, comm)
    for step in range(3):
        loss_of(model, *batch(step)).backward()
        engine.step()
    torch.manual_seed(1234)
    state = {"rng": torch.get_rng_state(), "weights": torch.arange(5.0), "epoch": 7,
             "generator": torch.Generator().manual_seed(5).get_state()}
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "notes.txt").write_text("the trainer's own")  # left alone
    engine.save_checkpoint(tmp_path / "ckpt", client_state=state)  # as DeepSpeed: global_step3
    expected_draw = torch.rand(4)
    engine.close()

    engine = zerort.torch.initialize(TinyLM(), {"stage": 2, "optimizer": OPTIMIZER}, comm)
    path, loaded = engine.load_checkpoint(tmp_path / "ckpt")
    assert path == str(tmp_path / "ckpt" / "global_step3")
    assert (tmp_path / "ckpt" / "notes.txt").read_text() == "the trainer's own"
    assert sorted(loaded) == sorted(state) and loaded["epoch"] == 7
    assert torch.equal(loaded["rng"], state["rng"]) and torch.equal(loaded["weights"],
                                                                      state["weights"])
    torch.set_rng_state(loaded["rng"])
    assert torch.equal(torch.rand(4), expected_draw)
    assert engine.global_steps == 3
    engine.close()
    comm.close()


def test_checkpoint_with_plain_json_client_state_still_loads(tmp_path):
    """User data written as plain JSON (checkpoints from before, other front doors)."""
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(TinyLM(), {"stage": 1}, comm)
    engine.engine.set_checkpoint_user_data(json.dumps({"next_step": 4}))
    engine.engine.save_checkpoint(tmp_path / "ckpt")
    assert engine.load_checkpoint(tmp_path / "ckpt")[1] == {"next_step": 4}
    engine.close()
    comm.close()


def test_a_series_whose_first_save_lost_its_latest_file_resumes_from_that_save(tmp_path):
    """The job died after its first checkpoint was complete and before `latest` was written:
    load_checkpoint(root) loads that checkpoint, saying so, instead of starting over."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": OPTIMIZER}, comm)
    loss_of(model, *batch(0)).backward()
    engine.step()
    engine.save_checkpoint(tmp_path, client_state={"epoch": 2})
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine.close()
    (tmp_path / "latest").unlink()
    (tmp_path / "global_step2.partial").mkdir()  # a later save that did not finish
    model = TinyLM()
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": OPTIMIZER}, comm)
    with pytest.warns(UserWarning, match="no `latest` file.*global_step1"):
        path, client_state = engine.load_checkpoint(tmp_path)
    assert path == str(tmp_path / "global_step1") and client_state == {"epoch": 2}
    assert engine.global_steps == 1
    assert all(torch.equal(p, saved[n]) for n, p in model.named_parameters())
    engine.close()
    comm.close()


class RowScale(torch.nn.Module):
    """x * w, summed per row."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x):
        return (x * self.weight).sum(-1)


def test_an_overflow_at_the_minimum_fp16_loss_scale_ends_the_run_as_deepspeeds():
    """DeepSpeed raises "Current loss scale already at minimum"; so does step(), the step
    skipped and counted, and a trainer that catches it may go on."""
    comm = zerort.local_group(1)[0]
    model = RowScale()  # elementwise: fp16 kernels every CPU PyTorch has
    inputs = torch.linspace(-1.0, 1.0, 32).reshape(4, 8).half()
    config = {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW",
                                                               "params": {"lr": 1e-3}},
              "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 2,
                       "hysteresis": 1, "min_loss_scale": 2}}
    engine = zerort.torch.initialize(model, config, comm)
    before = [p.detach().clone() for p in model.parameters()]

    def loss(scale=1.0):
        return model(inputs).float().pow(2).mean() * scale

    engine.backward(loss(float("inf")))
    assert engine.step()["skipped"] and engine.optimizer.cur_scale == 2.0
    engine.backward(loss(float("inf")))
    with pytest.raises(zerort.AbortedError, match="loss scale already at its minimum"):
        engine.step()
    assert (engine.global_steps, engine.skipped_steps) == (2, 2)
    assert not engine.was_step_applied()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    engine.backward(loss())
    assert not engine.step()["skipped"]
    engine.close()
    comm.close()


def frozen_head(model):
    model.head.requires_grad_(False)
    return model


@pytest.mark.parametrize("stage,micro", [(0, 1), (2, 4)])
def test_second_backward_before_step_names_the_fix(stage, micro):
    """Four loss.backward() calls, then one engine.step() (the PyTorch accumulation habit):
    the error says a second backward ran and names engine.step() and no_sync, not
    reentrant checkpointing. Only the adapters train, all inside reentrantly checkpointed
    blocks: the nested backwards are not taken for passes of their own."""
    config = {"stage": stage, "optimizer": OPTIMIZER, "gradient_accumulation_steps": micro,
              "guard": {"timeout_s": 30}}
    model = frozen_head(TinyLM(reentrant=True, input_requires_grad=True))
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(model, config, comm)
    tokens, targets = batch(0)
    with pytest.raises(zerort.DuplicateGradientError) as raised:
        for row in range(4):
            loss_of(model, tokens[row:row + 1], targets[row:row + 1]).backward()
        engine.step()
    message = str(raised.value)
    assert "second backward" in message and "engine.step()" in message
    assert "no_sync" in message and f"gradient_accumulation_steps = {micro}" in message
    assert "reentrant" not in message
    engine.close()
    comm.close()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_grad_drops_a_backward_no_step_followed(stage):
    """optimizer.zero_grad() after a backward no step() followed (a batch rejected once its
    loss is seen) drops it, and with accumulation the window's earlier micro-batches too, as
    PyTorch's zero_grad does; zero_grad() after step() drops nothing. The params trained are
    bit-for-bit those of a run that never saw the rejected batches, on 2 ranks."""
    config = {"stage": stage, "optimizer": OPTIMIZER, "gradient_accumulation_steps": 2,
              "stage3": {"persistence_threshold": 0}}

    def run(reject):
        models = [TinyLM() for _ in range(2)]  # here: TinyLM seeds the shared RNG

        def body(rank, comm):
            model = models[rank]
            engine = zerort.torch.initialize(model, config, comm)
            optimizer = engine.optimizer
            for step in range(3):
                if reject:  # a rejected micro-batch alone, then one after an accepted one
                    loss_of(model, *batch(50 + step)).backward()
                    optimizer.zero_grad()
                    loss_of(model, *batch(2 * step)).backward()
                    optimizer.step()
                    optimizer.zero_grad()  # after step(): the accumulation is kept
                    loss_of(model, *batch(60 + step)).backward()
                    optimizer.zero_grad()  # drops micro-batch 2 * step as well
                for micro in range(2):
                    optimizer.zero_grad()
                    loss_of(model, *batch(2 * step + micro)).backward()
                    optimizer.step()
            state = engine.state_dict()
            steps = engine.global_steps
            engine.close()
            comm.close()
            return state, steps

        return run_ranks(2, body)

    for (dropped, steps), (kept, kept_steps) in zip(run(True), run(False)):
        assert steps == kept_steps == 3
        assert dropped.keys() == kept.keys()
        assert all(torch.equal(dropped[name], kept[name]) for name in kept)


def test_zero_grad_drops_a_generator_pass_through_the_discriminator():
    """A GAN's loop as written for PyTorch: the generator's loss runs backward through the
    discriminator, whose engine receives those gradients; d_optimizer.zero_grad() before the
    discriminator's own backward drops them (before, the second backward was an error)."""
    torch.manual_seed(3)
    generator, discriminator = nn.Linear(4, 6), nn.Sequential(nn.Linear(6, 5), nn.Tanh(),
                                                               nn.Linear(5, 1))
    plain_g, plain_d = copy.deepcopy(generator), copy.deepcopy(discriminator)
    g_comm, d_comm = zerort.local_group(1)[0], zerort.local_group(1)[0]
    g_engine = zerort.torch.initialize(generator, {"stage": 2, "optimizer": OPTIMIZER}, g_comm)
    d_engine = zerort.torch.initialize(discriminator, {"stage": 2, "optimizer": OPTIMIZER}, d_comm)
    plain = [torch.optim.AdamW(m.parameters(), lr=OPTIMIZER["lr"], betas=OPTIMIZER["betas"],
                               eps=OPTIMIZER["eps"], weight_decay=OPTIMIZER["weight_decay"])
             for m in (plain_g, plain_d)]
    for step in range(3):
        noise = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        real = torch.randn(8, 6, generator=torch.Generator().manual_seed(10 + step))
        for (g, d), (g_opt, d_opt) in (((generator, discriminator),
                                        (g_engine.optimizer, d_engine.optimizer)),
                                       ((plain_g, plain_d), plain)):
            d_opt.zero_grad()
            (d(real).mean() - d(g(noise).detach()).mean()).backward()
            d_opt.step()
            g_opt.zero_grad()
            d(g(noise)).mean().backward()  # reaches the discriminator's params too
            g_opt.step()
    for ours, theirs in ((generator, plain_g), (discriminator, plain_d)):
        for mine, want in zip(ours.parameters(), theirs.parameters()):
            assert torch.allclose(mine, want, rtol=1e-5, atol=1e-6)
    for engine, comm in ((g_engine, g_comm), (d_engine, d_comm)):
        engine.close()
        comm.close()


@pytest.mark.parametrize("lend", [False, True])
def test_duplicate_inside_one_backward_keeps_the_reentrant_hint(lend):
    """The shared adapter's second gradient inside one backward (reentrant checkpointing's
    recomputation), with nothing trainable outside the checkpointed blocks: the library's
    message, which names reentrant checkpointing. Lending (a GPU's default), the gradients
    handed over before the duplicate stay with the engine until the step."""
    model = frozen_head(TinyLM(share_adapter=True, reentrant=True, input_requires_grad=True))
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": OPTIMIZER}, comm)
    engine.lend_gradients = lend
    with pytest.raises(zerort.DuplicateGradientError) as raised:
        loss_of(model, *batch(0)).backward()
    message = str(raised.value)
    assert "blocks.0.lora_a.weight" in message and "reentrant" in message
    assert "second backward" not in message
    assert (len(engine._lent_grads) > 0) == lend
    engine.close()
    comm.close()


@pytest.mark.parametrize("form", ["parameters", "named_parameters", "group"])
def test_model_parameters_in_pytorchs_formats(form):
    """model.parameters() (frozen ones are skipped), named_parameters() pairs, one group."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    given = {"parameters": model.parameters(), "named_parameters": model.named_parameters(),
             "group": [{"params": model.parameters(), "lr": 0.125}]}[form]
    engine = zerort.torch.initialize(model, {"stage": 1}, comm, model_parameters=given)
    group, = engine.optimizer.param_groups
    assert len(group["params"]) == len(engine.state_dict())
    assert engine.get_lr() == ([0.125] if form == "group" else [pytest.approx(1e-3)])
    engine.close()
    comm.close()


def model_parameters_error(groups_of):
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    with pytest.raises(zerort.InvalidArgumentError) as raised:
        zerort.torch.initialize(model, {"stage": 2}, comm, model_parameters=groups_of(model))
    comm.close()
    return str(raised.value)


def test_param_in_no_group_is_named():
    message = model_parameters_error(lambda m: [{"params": [m.head.weight]}])
    assert "head.bias" in message and "blocks.0.lora_a.weight" in message
    assert "head.weight" not in message.split(":", 1)[1]
    assert "requires_grad=False" in message


def test_param_in_two_groups_is_named():
    message = model_parameters_error(lambda m: [
        {"params": [p for p in m.parameters() if p.requires_grad]},
        {"params": [m.head.bias], "lr": 0.1}])
    assert "head.bias" in message and "groups 0 and 1" in message


def test_a_group_option_that_would_change_the_step_is_named():
    """amsgrad would change the step: named, not dropped (foreach only picks PyTorch's
    implementation, and a key of the trainer's own is kept: test_torch_deepspeed_initialize)."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    with pytest.raises(zerort.UnimplementedError) as raised:
        zerort.torch.initialize(model, {"stage": 2}, comm, model_parameters=[
            {"params": [p for p in model.parameters() if p.requires_grad], "amsgrad": True,
             "foreach": False}])
    comm.close()
    assert "amsgrad" in str(raised.value) and "foreach" not in str(raised.value)


def test_tensor_outside_the_model_is_refused():
    message = model_parameters_error(lambda m: [
        {"params": [p for p in m.parameters() if p.requires_grad] + [torch.zeros(3, 7)]}])
    assert "(3, 7)" in message


EXITS_AFTER_ERROR = """
import torch, zerort, zerort.torch
from test_torch_engine import TinyLM, batch, loss_of
model = TinyLM()
comm = zerort.local_group(1)[0]
engine = zerort.torch.initialize(model, {"stage": 2}, comm)
tokens, targets = batch(0)
try:
    for row in range(2):
        loss_of(model, tokens[row:row + 1], targets[row:row + 1]).backward()
except zerort.DuplicateGradientError as error:
    print(type(error).__name__)
engine.close()
comm.close()
"""


def test_a_process_exits_after_a_gradient_error():
    """A gradient error on the main thread, caught, the engine closed: the process exits. (A
    hook that raised would leave autograd's remaining work for that backward queued, and
    PyTorch 1.13 then hangs at exit freeing it; the error is raised as the backward ends.)"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-c", EXITS_AFTER_ERROR], env=env, timeout=60,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["DuplicateGradientError"]


def test_deepspeed_bf16_casts_an_fp32_model_as_deepspeed_does():
    """"bf16": {"enabled": true} with a float32 model: initialize casts it to bfloat16 (as
    deepspeed.initialize does) instead of refusing its float32 params."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    config = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
              "data_types": {"grad_accum_dtype": "fp32"},
              "zero_optimization": {"stage": 2}, "optimizer": DEEPSPEED["optimizer"]}
    engine = zerort.torch.initialize(model, config, comm)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    before = trained(model)
    engine.backward(loss_of(model, *batch(0)))
    engine.step()
    after = trained(model)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    engine.close()
    comm.close()


def test_a_saved_dynamic_loss_scale_does_not_reach_an_engine_without_one(tmp_path):
    """A checkpoint saved with dynamic loss scaling (65536), loaded by an engine configured
    without loss scaling: its scale stays 1, in the engine and in engine.backward."""
    comm = zerort.local_group(1)[0]
    dynamic = {"stage": 2, "optimizer": SGD, "loss_scale": {"mode": "dynamic"}}
    saver = zerort.torch.initialize(TinyLM(), dynamic, comm)
    assert saver.loss_scale == 65536.0
    saver.save_checkpoint(str(tmp_path / "ckpt"))
    saver.close()
    loader = zerort.torch.initialize(TinyLM(), {"stage": 2, "optimizer": SGD}, comm)
    loader.load_checkpoint(str(tmp_path / "ckpt"))
    assert loader.loss_scale == 1.0 and loader.engine.loss_scale == 1.0
    loader.close()
    comm.close()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_rank_alone_lends_its_gradients_and_trains_the_same(stage):
    """With engine.lend_gradients (a GPU's default; set here on the CPU) a rank alone copies no
    gradient into the engine: the step reads autograd's tensors where they are, with the same
    result, and they are let go once the step returns."""
    results = []
    for lend in (False, True):
        comm = zerort.local_group(1)[0]
        model = TinyLM()
        engine = zerort.torch.initialize(
            model, {"stage": stage, "optimizer": OPTIMIZER, "clip_grad_norm": 0.5}, comm)
        engine.lend_gradients = lend
        norms = []
        for step in range(3):
            engine.backward(loss_of(model, *batch(step)))
            trainable = [p for p in model.parameters() if p.requires_grad]
            assert len(engine._lent_grads) == (len(trainable) if lend else 0)
            norms.append(engine.step()["grad_norm"])
            assert not engine._lent_grads
            assert all(p.grad is None for p in model.parameters())
        copied = engine.counters()["grad_bytes_copied"]
        assert (copied == 0) == lend, copied
        results.append((norms, engine.state_dict()))
        engine.close()
        comm.close()
    (norms, copied), (lent_norms, lent) = results
    assert lent_norms == pytest.approx(norms, rel=1e-6)
    assert_close(lent, copied)


def bias_free_mlp():
    """Two bias-free Linear(16, 16) (256 elements each: with the buckets of
    FILLED_BUCKETS, each fills a bucket alone at 2 ranks) and a Linear(16, 1) head."""
    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 16, bias=False), torch.nn.Tanh(),
        torch.nn.Linear(16, 16, bias=False), torch.nn.Tanh(), torch.nn.Linear(16, 1))


FILLED_BUCKETS = {"first_bucket_elems": 200, "reduce_bucket_elems": 256}


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_two_ranks_lend_the_gradients_that_fill_a_bucket(stage):
    """On several ranks engine.lend_gradients lends a param that fills its bucket alone (its
    bucket's collective reads autograd's tensor) and copies the rest: the head's 17 elements
    per step here; training is the same as with every gradient copied."""
    def body(rank, comm, lend):
        model = models[lend][rank]
        engine = zerort.torch.initialize(
            model, {"stage": stage, "optimizer": OPTIMIZER, "buckets": FILLED_BUCKETS}, comm)
        engine.lend_gradients = lend
        generator = torch.Generator().manual_seed(10 + rank)
        for _ in range(3):
            x = torch.randn(8, 16, generator=generator)
            engine.backward(model(x).square().mean())
            assert len(engine._lent_grads) == (2 if lend else 0)
            engine.step()
            assert not engine._lent_grads
        result = engine.counters()["grad_bytes_copied"], engine.state_dict()
        engine.close()
        return result

    models = {lend: [bias_free_mlp() for _ in range(2)] for lend in (False, True)}  # one thread
    copied = run_ranks(2, lambda rank, comm: body(rank, comm, False))
    lent = run_ranks(2, lambda rank, comm: body(rank, comm, True))
    for (bytes_copied, state), (bytes_lent, lent_state) in zip(copied, lent):
        assert bytes_copied == 3 * 4 * (2 * 256 + 17)
        assert bytes_lent == 3 * 4 * 17
        assert_close(lent_state, state)


def test_deepspeed_max_reuse_distance_zero_keeps_no_unit_and_trains_the_same():
    """DeepSpeed's stage3_max_reuse_distance is stage3.max_reuse_elems: 0 frees every unit a
    forward releases (no unit kept for its backward), the default keeps them; the params
    trained are bit-for-bit the same."""
    def run(max_reuse_distance):
        model = TinyLM()
        config = {"train_micro_batch_size_per_gpu": BATCH,
                  "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                  "gradient_clipping": 0.0,
                  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
        if max_reuse_distance is not None:
            config["zero_optimization"]["stage3_max_reuse_distance"] = max_reuse_distance
        comm = zerort.local_group(1)[0]
        engine = zerort.torch.initialize(model, config, comm)
        for step in range(3):
            engine.backward(loss_of(model, *batch(step)))
            engine.step()
        kept = engine.counters()["releases_kept"]
        engine.close()
        comm.close()
        return kept, trained(model)

    (kept_none, none), (kept_default, default) = run(0), run(None)
    assert kept_none == 0 and kept_default == 2 * 9
    for name in default:
        assert torch.equal(none[name], default[name]), name


@pytest.mark.parametrize("world", [1, 2])
def test_counters_and_memory_stats_show_prefetching_and_what_each_rank_holds(world):
    """engine.counters() shows stage 3's prefetched and on-demand gathers, the reductions,
    the gradient bytes copied into the engine and the host waits (a rank alone runs no
    collective, so never waits); engine.memory_stats() what the rank holds per category.
    After the first step (which records the gather order) every unit whose forward output
    needs a gradient, all but the frozen embedding's (2 blocks of 4 and the head), stays
    gathered from its forward to its backward (released until backward)."""
    models = [TinyLM() for _ in range(world)]
    grad_bytes = sum(p.numel() * p.element_size() for p in models[0].parameters()
                     if p.requires_grad)

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, {"stage": 3, "optimizer": SGD,
                                                 "stage3": {"persistence_threshold": 0}},
                                         comm)
        for step in range(3):
            engine.backward(loss_of(model, *batch(step)))
            engine.step()
        counters, memory = engine.counters(), engine.memory_stats()
        engine.close()
        return counters, memory

    for counters, memory in run_ranks(world, body):
        assert counters["gathers_prefetched"] > 0 and counters["gathers_on_demand"] > 0
        assert counters["releases_kept"] == 2 * 9
        assert counters["grad_bytes_copied"] == 3 * grad_bytes
        if world == 1:
            assert counters["reductions_launched"] == 0 and counters["host_waits"] == 0
        else:
            assert counters["reductions_launched"] > 0
        assert memory["optimizer"][0] > 0 and memory["params"][1] >= memory["params"][0] > 0


def test_deepspeed_engine_calls_of_a_ported_script(tmp_path):
    """What a DeepSpeed script calls on its engine: engine(inputs), train()/eval(), the
    rank attributes, gradient_accumulation_steps() and the accumulation boundary, the batch
    sizes, and the checkpoint calls' keyword arguments (non-default ones are named)."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    config = {"zero_optimization": {"stage": 2},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    engine = zerort.torch.initialize(
        model, dict(config, train_batch_size=4, train_micro_batch_size_per_gpu=2), comm)
    assert engine.gradient_accumulation_steps() == 2 == engine.gradient_accumulation_steps
    assert (engine.global_rank, engine.zero_optimization_stage()) == (0, 2)
    assert (engine.train_micro_batch_size_per_gpu(), engine.train_batch_size()) == (2, 4)
    assert engine.eval() is engine and not model.training
    assert engine.train() is engine and model.training
    boundaries = []
    for step in range(4):
        tokens, targets = batch(step)
        logits = engine(tokens)
        assert torch.equal(logits, model(tokens))
        boundaries.append(engine.is_gradient_accumulation_boundary())
        engine.backward(torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                          targets.flatten()))
        engine.step()
    assert boundaries == [False, True, False, True]
    engine.save_checkpoint(str(tmp_path), tag="s2", save_latest=True)
    with pytest.raises(zerort.UnimplementedError, match="save_latest=False"):
        engine.save_checkpoint(str(tmp_path), tag="s3", save_latest=False)
    path, _ = engine.load_checkpoint(str(tmp_path), load_optimizer_states=True)
    assert path == str(tmp_path / "s2")
    with pytest.raises(zerort.UnimplementedError, match="load_module_only=True"):
        engine.load_checkpoint(str(tmp_path), load_lr_scheduler_states=False)
    engine.close()
    # The batch size a config leaves out is derived, as DeepSpeed does.
    for given, sizes in (({"train_batch_size": 8, "gradient_accumulation_steps": 2}, (4, 8)),
                         ({"train_micro_batch_size_per_gpu": 4,
                           "gradient_accumulation_steps": 2}, (4, 8))):
        engine = zerort.torch.initialize(TinyLM(), dict(config, **given), comm)
        assert (engine.train_micro_batch_size_per_gpu(), engine.train_batch_size()) == sizes
        engine.close()
    comm.close()


class Scale(nn.Module):
    """x times a weight of its own, elementwise."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x):
        return x * self.weight


def test_deepspeed_engine_queries_of_accelerate_and_the_hf_trainer():
    """engine.parameters(), device, fp16_enabled()/bfloat16_enabled(), gradient_clipping(),
    was_step_applied() (False between boundaries, as DeepSpeed's) and
    optimizer.overflow/cur_scale and skipped_steps (a step the loss scaler skips on an inf
    gradient),
    backward(scale_wrt_gas=False) and step(lr_kwargs=...) (refused with the config's
    schedule, ignored without one, as DeepSpeed does)."""
    comm = zerort.local_group(1)[0]
    ds = {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    model = Scale(4)  # elementwise: PyTorch 1.13 has no fp16 matmul on the CPU
    fp16 = {"enabled": True, "initial_scale_power": 4}
    warmup = {"type": "WarmupLR", "params": {"warmup_num_steps": 2}}
    engine = zerort.torch.initialize(
        model, dict(ds, fp16=fp16, gradient_clipping=0.5, scheduler=warmup), comm)
    assert [id(p) for p in engine.parameters()] == [id(p) for p in model.parameters()]
    assert [n for n, _ in engine.named_parameters()] == ["weight"]
    assert engine.device == torch.device("cpu")
    assert engine.fp16_enabled() and not engine.bfloat16_enabled()
    assert engine.gradient_clipping() == 0.5 and not engine.was_step_applied()
    assert engine.optimizer.cur_scale == engine.loss_scale == 2.0 ** 4
    for values in (float("inf"), 1.0):  # the first step overflows and is skipped
        for boundary in (False, True):
            engine.backward(model(torch.full((2, 4), values, dtype=torch.float16)).sum())
            engine.step()
            assert engine.was_step_applied() == (boundary and values == 1.0)
        assert engine.optimizer.overflow == (values != 1.0)
        assert engine.skipped_steps == 1 and engine.global_steps == (1 if values != 1.0 else 2)
    with pytest.raises(zerort.UnimplementedError, match="lr_kwargs"):
        engine.step(lr_kwargs={"last_batch_iteration": 3})
    engine.close()
    norms = []
    for scale_wrt_gas in (True, False):  # the same two micro-batches: twice the gradient
        model = Scale(4)
        engine = zerort.torch.initialize(model, ds, comm)
        for _ in range(2):
            engine.backward(model(torch.ones(2, 4)).sum(), scale_wrt_gas=scale_wrt_gas)
            engine.step(lr_kwargs={"last_batch_iteration": 3})  # no schedule: ignored
        norms.append(engine.get_global_grad_norm())
        engine.close()
    assert norms[1] == pytest.approx(2 * norms[0], rel=1e-6)
    comm.close()


def test_deepspeed_engine_calls_of_accelerate_and_the_hf_trainer_around_steps_and_saves(
        tmp_path):
    """set_gradient_accumulation_boundary() (Accelerate 1.8, before each micro-batch, with
    step() at boundaries only), the
    counters micro_steps, global_samples, dp_world_size, get_mom(), optimizer.loss_scale,
    zero_gather_16bit_weights_on_model_save() (Accelerate's get_state_dict at ZeRO-3),
    load_checkpoint() of a directory with no checkpoint yet ((None, None), as DeepSpeed's)
    and with load_module_strict=False (the HF Trainer's resume of a PEFT model)."""
    comm = zerort.local_group(1)[0]
    ds = {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2,
          "train_micro_batch_size_per_gpu": 3,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.8, 0.9]}}}
    model = Scale(4)
    engine = zerort.torch.initialize(model, ds, comm)
    with pytest.warns(UserWarning, match="Unable to find latest file"):
        assert engine.load_checkpoint(str(tmp_path / "none yet")) == (None, None)
    for micro_batch in range(4):  # Accelerate 1.8's calls: step() at boundaries only
        boundary = micro_batch % 2 == 1
        with pytest.raises(zerort.UnimplementedError, match="sync_with_dataloader"):
            engine.set_gradient_accumulation_boundary(not boundary)
        engine.set_gradient_accumulation_boundary(boundary)
        engine.backward(model(torch.ones(3, 4)).sum())
        if boundary:
            assert engine.step() is not None
    # micro_steps counts the script's step() calls, as DeepSpeed's (2 here, 4 micro-batches)
    assert (engine.micro_steps, engine.global_steps, engine.global_samples) == (2, 2, 12)
    assert engine.dp_world_size == 1 and not engine.zero_optimization_partition_weights()
    assert engine.training and not engine.eval().training and engine.train().training
    assert engine.zero_gather_16bit_weights_on_model_save()
    assert [list(betas) for betas in engine.get_mom()] == [[0.8, 0.9]]
    assert engine.optimizer.loss_scale == 1.0
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    saved = engine.state_dict()["weight"].clone()
    for _ in range(2):
        engine.backward(model(torch.ones(3, 4)).sum())
        engine.step()
    path, _ = engine.load_checkpoint(str(tmp_path / "ckpt"), load_module_strict=False)
    assert path.endswith("global_step2") and torch.equal(engine.state_dict()["weight"], saved)
    engine.close()
    assert engine.train_batch_size() == 6  # a config query, also after close()
    comm.close()


@pytest.mark.parametrize("stage,call", [(2, "save_checkpoint"), (3, "state_dict"),
                                        (3, "forward")])
def test_a_collective_call_on_rank_0_only_names_what_every_rank_must_call(stage, call,
                                                                          tmp_path):
    """The porting mistake `if rank == 0: engine.save_checkpoint(...)` (or state_dict(), or
    an evaluation forward at stage 3): rank 0's error says which of its calls every rank
    must make, beside the collective that did not match."""
    config = {"stage": stage, "optimizer": OPTIMIZER, "guard": {"timeout_s": 10},
              "stage3": {"persistence_threshold": 0}}
    models = [TinyLM() for _ in range(2)]  # here: TinyLM seeds the shared RNG

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        try:
            loss_of(model, *batch(rank)).backward()
            engine.step()
            if rank == 0 and call == "save_checkpoint":
                engine.save_checkpoint(str(tmp_path))
            elif rank == 0 and call == "state_dict":
                engine.state_dict()
            elif rank == 0:
                with torch.no_grad():
                    loss_of(model, *batch(5))
            loss_of(model, *batch(2 + rank)).backward()
            engine.step()
        except zerort.ZeroError as error:
            return error
        finally:
            try:
                engine.close()
            except zerort.ZeroError:
                pass  # the group is broken: close says so too
        return None

    failures = run_ranks(2, body)
    what = {"save_checkpoint": "engine.save_checkpoint()", "state_dict": "engine.state_dict()",
            "forward": "a stage-3 gather (each module's forward and backward)"}[call]
    assert failures[0] is not None and f"{what} is collective" in str(failures[0])
