"""safe_get_full_fp32_param, safe_get_full_optimizer_state and safe_get_full_grad (DeepSpeed's
names, zerort.torch and zerort.torch.deepspeed.utils): every rank reads the whole fp32 master,
moments and gradient of each trainable param, equal to single-process PyTorch's param, AdamW
state and .grad, at every stage on 3 in-process ranks with gradient accumulation."""
import pytest
import torch

import zerort
import zerort.torch
from zerort.torch import deepspeed
from test_torch_engine import OPTIMIZER, TinyLM, batch, loss_of, micro_batch, run_ranks

WORLD, ACCUMULATION, STEPS = 3, 2, 3
ROWS = 4  # per rank and micro-batch (each batch(i) has 8 rows: two micro-batches' worth)


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def rows(step, micro, rank):
    """The rows rank `rank` trains on in micro-batch `micro` of step `step`."""
    return micro_batch(100, WORLD, ACCUMULATION, ROWS, step, micro, rank)


def reference():
    """Single-process PyTorch over every rank's micro-batches; per step, each param's .grad
    before the step and its value and AdamW state after it."""
    model = TinyLM()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(params.values(), lr=OPTIMIZER["lr"], betas=OPTIMIZER["betas"],
                                  eps=OPTIMIZER["eps"], weight_decay=OPTIMIZER["weight_decay"])
    seen = []
    for step in range(STEPS):
        optimizer.zero_grad()
        for micro in range(ACCUMULATION):
            for rank in range(WORLD):
                (loss_of(model, *rows(step, micro, rank)) / (WORLD * ACCUMULATION)).backward()
        grads = {n: p.grad.clone() for n, p in params.items()}
        optimizer.step()
        seen.append({n: (grads[n], p.detach().clone(), optimizer.state[p]["exp_avg"].clone(),
                         optimizer.state[p]["exp_avg_sq"].clone()) for n, p in params.items()})
    return seen


def assert_near(got, want, what):
    scale = max(want.abs().max().item(), 1e-6)
    error = (got - want).abs().max().item() / scale
    assert got.dtype == torch.float32 and got.shape == want.shape, what
    assert error <= 2e-5, f"{what}: relative error {error:.2e}"


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_rank_reads_the_full_master_moments_and_gradient(stage):
    want = reference()
    config = {"zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "AdamW", "params": {
                  "lr": OPTIMIZER["lr"], "betas": OPTIMIZER["betas"], "eps": OPTIMIZER["eps"],
                  "weight_decay": OPTIMIZER["weight_decay"]}},
              "gradient_clipping": 0.0, "gradient_accumulation_steps": ACCUMULATION,
              "train_micro_batch_size_per_gpu": ROWS}
    models = [TinyLM() for _ in range(WORLD)]

    def body(rank, comm):
        model = models[rank]
        engine, _, _, _ = deepspeed.initialize(model=model, config=config, comm=comm)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        for step in range(STEPS):
            for micro in range(ACCUMULATION):
                engine.backward(loss_of(model, *rows(step, micro, rank)))
                if micro + 1 < ACCUMULATION:
                    engine.step()
            for name, param in named:
                assert_near(deepspeed.utils.safe_get_full_grad(param), want[step][name][0],
                            f"step {step} grad of {name}")
            engine.step()
            assert engine.was_step_applied()
            for name, param in named:
                _, weights, exp_avg, exp_avg_sq = want[step][name]
                assert_near(zerort.torch.safe_get_full_fp32_param(param), weights, name)
                assert_near(zerort.torch.safe_get_full_optimizer_state(param, "exp_avg"),
                            exp_avg, f"exp_avg of {name}")
                assert_near(deepspeed.utils.safe_get_full_optimizer_state(param, "exp_avg_sq"),
                            exp_avg_sq, f"exp_avg_sq of {name}")
        engine.close()
        return {n: p.detach().clone() for n, p in named}

    for trained in run_ranks(WORLD, body):
        for name, value in trained.items():
            assert_near(value, want[-1][name][1], f"trained {name}")


def test_zero_grad_after_reading_the_gradient_drops_the_step():
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": OPTIMIZER}, comm)
    before = model.head.weight.detach().clone()
    loss_of(model, *batch(0)).backward()
    assert zerort.torch.safe_get_full_grad(model.head.weight).abs().sum() > 0
    engine.optimizer.zero_grad()
    loss_of(model, *batch(1)).backward()
    engine.step()
    second = zerort.torch.safe_get_full_fp32_param(model.head.weight)
    assert torch.equal(second, model.head.weight.detach())
    assert not torch.equal(second, before)
    engine.close()


def test_what_cannot_be_read_is_named():
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    config = {"stage": 1, "optimizer": OPTIMIZER, "gradient_accumulation_steps": 2}
    engine = zerort.torch.initialize(model, config, comm)
    with pytest.raises(zerort.FailedPreconditionError, match="after the backward of the last"):
        zerort.torch.safe_get_full_grad(model.head.weight)  # the window's first micro-batch
    with pytest.raises(zerort.InvalidArgumentError, match="keeps no 'momentum_buffer'"):
        zerort.torch.safe_get_full_optimizer_state(model.head.weight, "momentum_buffer")
    with pytest.raises(zerort.InvalidArgumentError, match="no open engine"):
        zerort.torch.safe_get_full_fp32_param(torch.nn.Parameter(torch.zeros(3)))
    # As DeepSpeed's: None for a param the optimizer does not step (the frozen embedding).
    assert zerort.torch.safe_get_full_fp32_param(model.embed.weight) is None
    loss_of(model, *batch(0)).backward()
    with pytest.raises(zerort.FailedPreconditionError, match="not between a backward and its"):
        zerort.torch.safe_get_full_fp32_param(model.head.weight)
    engine.step()  # the window's first micro-batch: the weights read as before it
    weights = zerort.torch.safe_get_full_fp32_param(model.head.weight)
    assert torch.equal(weights, model.head.weight.detach())
    moments = zerort.torch.safe_get_full_optimizer_state(model.head.weight, "exp_avg")
    assert moments.abs().sum() == 0  # no optimizer step yet
    engine.close()
    sgd = zerort.torch.initialize(TinyLM(), {"stage": 1, "optimizer": {"type": "sgd"}}, comm)
    with pytest.raises(zerort.NotFoundError, match="keeps 0 moment"):
        zerort.torch.safe_get_full_optimizer_state(sgd.module.head.weight, "momentum_buffer")
    with pytest.raises(zerort.InvalidArgumentError, match="keeps no 'exp_avg'"):
        zerort.torch.safe_get_full_optimizer_state(sgd.module.head.weight, "exp_avg")
    sgd.module.head.weight.data = torch.zeros(1)  # replaced: refused, never written past
    with pytest.raises(zerort.FailedPreconditionError, match="head.weight"):
        zerort.torch.safe_get_full_fp32_param(sgd.module.head.weight)
    sgd.close()


def test_the_window_a_gradient_read_ended_is_the_boundary_and_steps_once():
    """After safe_get_full_grad the window's last micro-batch is over: the engine reports the
    boundary, refuses no_sync() and save_checkpoint(), and step() steps once."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    config = {"stage": 2, "optimizer": OPTIMIZER, "gradient_accumulation_steps": 2}
    engine = zerort.torch.initialize(model, config, comm)
    engine.backward(loss_of(model, *batch(0)))
    assert not engine.is_gradient_accumulation_boundary()
    engine.step()
    engine.backward(loss_of(model, *batch(1)))
    zerort.torch.safe_get_full_grad(model.head.weight)
    assert engine.is_gradient_accumulation_boundary()
    with pytest.raises(zerort.FailedPreconditionError):
        with engine.no_sync():
            pass
    with pytest.raises(zerort.FailedPreconditionError, match="2 of 2 micro-batches"):
        engine.save_checkpoint("unused-directory")
    engine.step()
    assert engine.global_steps == 1 and engine.was_step_applied()
    engine.close()


def test_a_rank_whose_last_micro_batch_had_no_backward_reads_with_its_peers():
    """guard.on_unused = "zero": rank 1 rejects its last batch and runs no backward. Reading
    the gradient ends that micro-batch on both ranks, as step() does, instead of refusing on
    rank 1 alone while rank 0 waits in the reduction."""
    models = [TinyLM() for _ in range(2)]
    config = {"stage": 1, "optimizer": OPTIMIZER, "guard": {"on_unused": "zero", "timeout_s": 20}}

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        if rank == 0:
            engine.backward(loss_of(model, *batch(0)))
        grad = zerort.torch.safe_get_full_grad(model.head.weight)
        engine.step()
        engine.close()
        return grad

    grads = run_ranks(2, body)
    assert torch.equal(grads[0], grads[1]) and grads[0].abs().sum() > 0


def set_values(shape, seed):
    """Fresh weights and moments for safe_set_full_*: (weights, exp_avg, exp_avg_sq)."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(shape, generator=generator)
    return weights, 0.1 * torch.randn(shape, generator=generator), \
        0.01 * torch.rand(shape, generator=generator)


@pytest.mark.parametrize("stage,persistence", [(0, 0), (1, 0), (2, 0), (3, 0), (3, 10**6)])
def test_set_master_and_moments_then_train_as_pytorch_would(stage, persistence):
    """safe_set_full_fp32_param and safe_set_full_optimizer_state after a step on 3 ranks:
    read back exactly, seen by the next forward (stage 3 gathered on demand or kept
    persistent), and the training after them equals PyTorch's with the same values set."""
    named = dict(TinyLM().named_parameters())
    values = {n: set_values(named[n].shape, i) for i, n in
              enumerate(("head.weight", "blocks.0.lora_b.weight"))}
    model = TinyLM()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(params.values(), lr=OPTIMIZER["lr"], betas=OPTIMIZER["betas"],
                                  eps=OPTIMIZER["eps"], weight_decay=OPTIMIZER["weight_decay"])
    for step in range(STEPS):
        optimizer.zero_grad()
        for rank in range(WORLD):
            (loss_of(model, *rows(step, 0, rank)) / WORLD).backward()
        optimizer.step()
        if step == 0:
            with torch.no_grad():
                for name, (weights, exp_avg, exp_avg_sq) in values.items():
                    params[name].copy_(weights)
                    optimizer.state[params[name]]["exp_avg"].copy_(exp_avg)
                    optimizer.state[params[name]]["exp_avg_sq"].copy_(exp_avg_sq)
    want = {n: p.detach().clone() for n, p in params.items()}
    config = {"stage": stage, "optimizer": OPTIMIZER,
              "stage3": {"persistence_threshold": persistence}}
    models = [TinyLM() for _ in range(WORLD)]  # TinyLM seeds torch's RNG: not in threads

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        trainable = dict(model.named_parameters())
        for step in range(STEPS):
            loss_of(model, *rows(step, 0, rank)).backward()
            engine.step()
            if step == 0:
                for name, (weights, exp_avg, exp_avg_sq) in values.items():
                    param = trainable[name]
                    deepspeed.utils.safe_set_full_fp32_param(param, weights)
                    zerort.torch.safe_set_full_optimizer_state(param, exp_avg, "exp_avg")
                    deepspeed.utils.safe_set_full_optimizer_state(param, exp_avg_sq,
                                                                  "exp_avg_sq")
                    assert torch.equal(zerort.torch.safe_get_full_fp32_param(param), weights)
                    assert torch.equal(
                        zerort.torch.safe_get_full_optimizer_state(param, "exp_avg_sq"),
                        exp_avg_sq)
                with zerort.torch.gathered([trainable["head.weight"]]):
                    assert torch.equal(trainable["head.weight"].detach(),
                                       values["head.weight"][0])
        engine.close()
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    for trained in run_ranks(WORLD, body):
        for name, value in trained.items():
            assert_near(value, want[name], f"trained {name}")


def test_set_of_a_bf16_param_keeps_the_fp32_master_exact_and_rounds_the_param():
    comm = zerort.local_group(1)[0]
    model = TinyLM().to(torch.bfloat16)
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": OPTIMIZER}, comm)
    weights, _, _ = set_values(model.head.weight.shape, 5)
    zerort.torch.safe_set_full_fp32_param(model.head.weight, weights)
    assert torch.equal(zerort.torch.safe_get_full_fp32_param(model.head.weight), weights)
    assert torch.equal(model.head.weight.detach(), weights.to(torch.bfloat16))
    # Refused, nothing changed: another shape, the gradient, a key AdamW does not keep, and
    # between a backward and its step().
    moments = zerort.torch.safe_get_full_optimizer_state(model.head.weight, "exp_avg")
    with pytest.raises(zerort.InvalidArgumentError, match="shape"):
        zerort.torch.safe_set_full_fp32_param(model.head.weight, weights[1:])
    with pytest.raises(zerort.InvalidArgumentError, match="keeps no 'momentum_buffer'"):
        zerort.torch.safe_set_full_optimizer_state(model.head.weight, weights, "momentum_buffer")
    with pytest.raises(zerort.InvalidArgumentError, match="comes from backward"):
        engine.set_full_state(model.head.weight, "grad", weights)
    assert torch.equal(zerort.torch.safe_get_full_fp32_param(model.head.weight), weights)
    assert torch.equal(
        zerort.torch.safe_get_full_optimizer_state(model.head.weight, "exp_avg"), moments)
    loss_of(model, *batch(0)).float().backward()
    with pytest.raises(zerort.FailedPreconditionError, match="mix the old and the new"):
        zerort.torch.safe_set_full_fp32_param(model.head.weight, weights * 2)
    grad = zerort.torch.safe_get_full_grad(model.head.weight)
    engine.step()  # AdamW's first step from `weights` moves each element by about lr at most
    moved = zerort.torch.safe_get_full_fp32_param(model.head.weight) - weights
    assert 0 < moved.abs().max() <= 1.01 * OPTIMIZER["lr"] * (1 + weights.abs().max()), grad
    # A frozen param: nothing, as DeepSpeed's.
    frozen = model.embed.weight
    zerort.torch.safe_set_full_fp32_param(frozen, torch.zeros(frozen.shape))
    assert frozen.abs().sum() > 0
    engine.close()


def test_a_set_waits_for_the_step_of_a_forward_with_gradients():
    """Between a forward (gradients enabled) and its micro-batch's step() the gradient would
    mix the old and the new weights: refused in every micro-batch of the window, nothing
    changed; after a forward without gradients (an eval pass) it is taken."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, {"stage": 1, "optimizer": OPTIMIZER,
                                             "gradient_accumulation_steps": 2}, comm)
    head = model.head.weight
    weights, _, _ = set_values(head.shape, 9)
    first = zerort.torch.safe_get_full_fp32_param(head)
    for micro in range(2):
        loss = loss_of(model, *batch(micro))
        with pytest.raises(zerort.FailedPreconditionError, match="mix the old and the new"):
            zerort.torch.safe_set_full_fp32_param(head, weights)
        engine.backward(loss)
        engine.step()
        if micro == 0:  # inside the window: the refused set changed nothing
            assert torch.equal(zerort.torch.safe_get_full_fp32_param(head), first)
    with torch.no_grad():
        loss_of(model, *batch(2))
    zerort.torch.safe_set_full_fp32_param(head, weights)
    assert torch.equal(head.detach(), weights)
    engine.close()


def test_sgd_momentum_is_set_from_the_params_first_step_on():
    """SGD's buffer starts from the first step's gradient (PyTorch's has none before it):
    a value set before that step would be dropped, so it is refused until then."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": {
        "type": "sgd", "lr": 0.1, "momentum": 0.9}}, comm)
    head = model.head.weight
    _, buffer, _ = set_values(head.shape, 4)
    with pytest.raises(zerort.FailedPreconditionError, match="first optimizer step"):
        zerort.torch.safe_set_full_optimizer_state(head, buffer, "momentum_buffer")
    loss_of(model, *batch(0)).backward()
    engine.step()
    zerort.torch.safe_set_full_optimizer_state(head, buffer, "momentum_buffer")
    before = head.detach().clone()
    loss_of(model, *batch(1)).backward()
    grad = zerort.torch.safe_get_full_grad(head)
    engine.step()
    want = before - 0.1 * (0.9 * buffer + grad)  # PyTorch's SGD with that buffer
    assert (head.detach() - want).abs().max() < 1e-6
    engine.close()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_modifier_block_keeps_the_masters_of_bf16_params_it_left_unchanged(stage):
    """gathered(modifier_rank=0) sets the params the block changed; a bf16 param it left as
    it was keeps the fp32 master its steps left (bits below bf16's included), a changed one
    takes the written values (also at stage 0, where each rank holds every master)."""
    models = [TinyLM().to(torch.bfloat16) for _ in range(2)]

    def body(rank, comm):
        model = models[rank]
        config = {"zero_optimization": {"stage": stage,
                                        "stage3_param_persistence_threshold": 0},
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
        engine = zerort.torch.initialize(model, config, comm)
        loss_of(model, *batch(rank)).float().backward()
        engine.step()
        trainable = [p for p in model.parameters() if p.requires_grad]
        masters = [zerort.torch.safe_get_full_fp32_param(p) for p in trainable]
        head = model.head.weight
        with zerort.torch.gathered(trainable, modifier_rank=0):
            with torch.no_grad():
                head.add_(1.0)
            written = head.detach().float().clone()
        after = [zerort.torch.safe_get_full_fp32_param(p) for p in trainable]
        engine.close()
        return masters, after, [p is head for p in trainable], written

    for masters, after, is_head, written in run_ranks(2, body):
        assert any(not torch.equal(m, m.bfloat16().float()) for m in masters)
        for before, now, changed in zip(masters, after, is_head):
            assert torch.equal(now, written if changed else before)


@pytest.mark.parametrize("stage", [0, 2])
def test_a_modifier_block_takes_writes_made_before_it_and_decides_alike_on_every_rank(stage):
    """A write made before the block (head.zero_() between steps, not yet taken) is set by
    it even when the block changes nothing; a replica that drifted on one rank (a write on
    rank 1 only) is set on every rank from rank 0's values, never on some ranks only (which
    split the ranks' collectives)."""
    models = [TinyLM().to(torch.bfloat16) for _ in range(2)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, {"stage": stage, "optimizer": {
            "type": "adamw", "lr": 1e-3}, "guard": {"timeout_s": 30}}, comm)
        loss_of(model, *batch(rank)).float().backward()
        engine.step()
        head, bias = model.head.weight, model.head.bias
        with torch.no_grad():
            head.zero_()
            if rank == 1:
                bias.add_(1.0)
        with zerort.torch.gathered([head, bias], modifier_rank=0):
            pass
        loss_of(model, *batch(2)).float().backward()
        engine.step()
        masters = [zerort.torch.safe_get_full_fp32_param(p) for p in (head, bias)]
        engine.close()
        return masters

    (head0, bias0), (head1, bias1) = run_ranks(2, body)
    assert head0.abs().max() < 0.01 and torch.equal(head0, head1)
    assert torch.equal(bias0, bias1)


def test_a_set_one_rank_refuses_is_refused_on_every_rank_at_once():
    """A value of the wrong shape on rank 1 alone: both ranks raise at once (rank 0 saying
    another rank refused), instead of rank 0 waiting for rank 1 in the engine's comparison."""
    models = [TinyLM() for _ in range(2)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": OPTIMIZER,
                                                 "guard": {"timeout_s": 300}}, comm)
        head = model.head.weight
        value = torch.zeros(head.shape[0], head.shape[1] + rank)
        with pytest.raises(zerort.InvalidArgumentError,
                           match="shape" if rank == 1 else "refused on another rank"):
            zerort.torch.safe_set_full_fp32_param(head, value)
        engine.close()

    run_ranks(2, body)
