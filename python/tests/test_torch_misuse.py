"""zerort.torch against what adversarial users did to it: an engine dropped without close(),
a model cast or changed after initialize(), gradients rejected inside backward, a second
initialize(), bad configs, zero-element params, mixtures of experts with idle experts under
guard.on_unused = "zero", and ranks whose frozen state differs. Each of these once read
freed memory, wrote past a buffer, trained silently wrong or failed with the wrong error.

Scenarios that would read freed memory or write past a buffer if they regressed run in a
child process, so a regression fails its test instead of crashing the whole run.
"""
import gc
import os
import subprocess
import sys
import textwrap
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zerort
import zerort.torch
from test_torch_engine import OPTIMIZER, TinyLM, assert_close, batch, loss_of, run_ranks

SGD = {"type": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def run_child(code):
    """Runs `code` in a fresh interpreter (this test's sys.path); returns its stdout lines."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                            timeout=120, capture_output=True, text=True)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    return result.stdout.split("\n")


def one_rank(model, config):
    comm = zerort.local_group(1)[0]
    return zerort.torch.initialize(model, config, comm), comm


# 1. An engine the garbage collector frees (never closed) ---------------------------------

DROPPED_ENGINE = """
import gc, torch, zerort, zerort.torch
from torch import nn
torch.set_num_threads(1)

def train(stage, threshold):
    # Model, engine and communicator all die with this frame; the caller keeps a param and
    # a view derived from the other before the engine went.
    torch.manual_seed(0)
    model = nn.Linear(256, 256)
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(model, {{
        "stage": stage, "optimizer": {{"type": "sgd", "lr": 0.1}},
        "stage3": {{"persistence_threshold": threshold}}}}, comm)
    model(torch.randn(4, 256)).sum().backward()
    engine.step()
    trained = engine.state_dict()
    derived = model.bias.detach()[:16] if threshold else None
    return model.weight, derived, trained

def scribble():
    # Reuses freed memory: what still points there changes.
    return [torch.full((256, 256), 7.0) for _ in range(16)] + [torch.full((4096,), 7.0)]

for stage, threshold in {cases}:
    weight, derived, trained = train(stage, threshold)
    gc.collect()
    junk = scribble()
    if threshold:  # params viewed the engine's memory: they own copies now
        print(stage, threshold, torch.equal(weight.detach(), trained["weight"]),
              torch.equal(derived, trained["bias"][:16]))
    else:  # sharded: no values without a gather, a same-shaped NaN stand-in, no crash
        print(stage, threshold, tuple(weight.shape), bool(torch.isnan(weight).all()))
"""


@pytest.mark.parametrize("stage,threshold", [(2, 100000), (3, 100000), (3, 0)])
def test_params_outlive_an_engine_that_was_never_closed(stage, threshold):
    """The garbage collector frees a model's engine: the params still in use own their last
    values (stages 0-2 and stage-3 persistent units: copies; the engine's memory stays
    while a view derived before, such as param.detach(), exists); a sharded stage-3 param
    cannot be gathered from a finalizer, and reads as NaN instead of freed memory."""
    out = run_child(DROPPED_ENGINE.format(cases=[(stage, threshold)]))
    want = (f"{stage} {threshold} True True" if threshold
            else f"{stage} {threshold} (256, 256) True")
    assert out[0] == want


CLOSED_ENGINE_VIEW = """
import gc, torch, zerort, zerort.torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Linear(256, 256)
comm = zerort.local_group(1)[0]
engine = zerort.torch.initialize(model, {"stage": 1, "optimizer": {"type": "sgd", "lr": 0.1}},
                                 comm)
model(torch.randn(4, 256)).sum().backward()
engine.step()
alias = model.weight.detach()  # shares the engine's memory
want = alias.clone()
engine.close()
comm.close()
del engine, comm
gc.collect()
junk = [torch.full((256, 256), 7.0) for _ in range(16)]
print(torch.equal(alias, want), torch.equal(model.weight.detach(), want),
      model.weight.data_ptr() != alias.data_ptr())
"""


def test_a_view_taken_before_close_stays_valid():
    """close() gives the params their own copies; a tensor that aliased the engine's memory
    before (param.detach()) keeps that memory alive instead of reading freed memory."""
    assert run_child(CLOSED_ENGINE_VIEW)[0] == "True True True"


def test_the_engines_memory_goes_once_nothing_views_it():
    """close() frees the engine's memory at once when the params were its only views, and
    only after the last alias otherwise."""
    for keep_alias in (False, True):
        model = bias_model()
        engine, comm = one_rank(model, {"stage": 2, "optimizer": SGD})
        memory = weakref.ref(engine.engine.memory_owner)
        alias = model.weight.detach() if keep_alias else None
        engine.close()
        gc.collect()
        assert (memory() is not None) == keep_alias
        del alias
        gc.collect()
        assert memory() is None
        comm.close()


# 2. A model cast or resized after initialize() -------------------------------------------

CHANGED_PARAMS = """
import torch, zerort, zerort.torch
from torch import nn
torch.set_num_threads(1)

def engine_for(model, stage):
    comm = zerort.local_group(1)[0]
    return zerort.torch.initialize(model, {{"stage": stage, "optimizer": {{"type": "sgd"}},
                                            "stage3": {{"persistence_threshold": 0}}}}, comm)

def report(what, call):
    try:
        call()
        print(what, "no error")
    except zerort.FailedPreconditionError as error:
        print(what, type(error).__name__, str(error).replace("\\n", " "))

case = {case!r}
model = nn.Linear(256, 256)
if case == "half":
    engine = engine_for(model, 2)
    model.half()
    report("state_dict", engine.state_dict)
    # (CPU PyTorch 1.13 has no fp16 matmul: the gradient reaches the weight through a cast)
    report("backward", lambda: model.weight.float().sum().backward())
elif case == "smaller":
    engine = engine_for(model, 1)
    model.weight.data = torch.zeros(16, 16)
    report("state_dict", engine.state_dict)
    report("step", engine.step)
elif case == "smaller-stage3":
    engine = engine_for(model, 3)
    model.weight.data = torch.zeros(16, 256)
    report("forward", lambda: model(torch.randn(2, 256)))
"""


@pytest.mark.parametrize("case,calls,change", [
    ("half", ["state_dict", "backward"], "dtype torch.float32 -> torch.float16"),
    ("smaller", ["state_dict", "step"], "shape (256, 256) -> (16, 16)"),
    ("smaller-stage3", ["forward"], "shape (256, 256) -> (16, 256)")])
def test_a_param_cast_or_resized_after_initialize_is_named(case, calls, change):
    """model.half(), or a smaller .data, after initialize(): every call that would hand a
    param's memory to the engine (state_dict, a gradient, a stage-3 gather) raises an
    error naming the param and the change, instead of writing past the buffer."""
    out = run_child(CHANGED_PARAMS.format(case=case))
    for line, call in zip(out, calls):
        assert line.startswith(f"{call} FailedPreconditionError"), line
        assert '"weight"' in line and change in line, line


# 3. A gradient rejected inside backward --------------------------------------------------

def bias_model():
    torch.manual_seed(0)
    return nn.Linear(4, 1)


def plain_sgd_steps(model, x, steps):
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    for _ in range(steps):
        optimizer.zero_grad()
        model(x).mean().backward()
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_a_gradient_interrupted_in_its_hook_never_reaches_a_step():
    """KeyboardInterrupt inside the gradient hook (here: as the engine starts the
    micro-batch), and a second backward of one graph (DuplicateGradientError): what was
    rejected must not be added to a later step (it once stayed in .grad and joined the
    next backward's gradient: the bias moved twice as far)."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    want = plain_sgd_steps(bias_model(), x, 2)

    def body(_rank, comm):
        model = bias_model()
        engine = zerort.torch.initialize(model, {
            "stage": 2, "optimizer": dict(SGD, lr=1.0),
            "guard": {"on_unused": "zero"}}, comm)
        model(x).mean().backward()
        engine.step()
        real = engine.engine.begin_iteration
        calls = []

        def interrupted():
            calls.append(1)
            raise KeyboardInterrupt

        engine.engine.begin_iteration = interrupted
        try:
            model(x).mean().backward()
        except KeyboardInterrupt:
            pass
        engine.engine.begin_iteration = real
        assert calls, "the interrupt did not happen inside the hook"
        engine.step()  # an empty micro-batch: nothing arrived, nothing changes
        loss = model(x).mean()
        loss.backward(retain_graph=True)
        with pytest.raises(zerort.DuplicateGradientError):
            loss.backward()
        assert all(p.grad is None for p in model.parameters())
        engine.step()
        engine.close()
        comm.close()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    got, = run_ranks(1, body)
    assert_close(got, want)


# 5. A second initialize() while the first engine is open ---------------------------------

def test_second_initialize_is_refused_until_the_first_engine_is_closed():
    model = bias_model()
    engine, comm = one_rank(model, {"stage": 2, "optimizer": SGD})
    with pytest.raises(zerort.FailedPreconditionError) as raised:
        zerort.torch.initialize(model, {"zero_optimization": {"stage": 2},
                                        "bf16": {"enabled": True}}, zerort.local_group(1)[0])
    message = str(raised.value)
    assert '"weight"' in message and "close()" in message
    assert model.weight.dtype == torch.float32  # the refused call changed nothing
    model(torch.ones(2, 4)).sum().backward()
    assert engine.step() is not None  # the first engine still trains
    engine.close()
    second, comm2 = one_rank(model, {"stage": 2, "optimizer": SGD})
    before = model.weight.detach().clone()
    model(torch.ones(2, 4)).sum().backward()
    second.step()  # no UnusedParametersError: the second engine gets the gradients
    assert not torch.equal(model.weight.detach(), before)
    second.close()
    comm.close()
    comm2.close()


# 6. The model changed after initialize() -------------------------------------------------

class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(4, 4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.frozen(self.body(x)) + (self.extra(x) if hasattr(self, "extra") else 0)


def change_after_initialize(stage, change):
    """Applies `change` to a model after initialize(), trains a step; the error."""
    model = Frozen()
    engine, comm = one_rank(model, {"stage": stage, "optimizer": SGD,
                                    "stage3": {"persistence_threshold": 0}})
    model(torch.ones(2, 4)).sum().backward()
    engine.step()
    change(model)
    with pytest.raises(zerort.FailedPreconditionError) as raised:
        model(torch.ones(2, 4)).sum().backward()
        engine.step()
    engine.close()
    comm.close()
    return str(raised.value)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_param_added_after_initialize_is_named(stage):
    def add(model):
        model.extra = nn.Linear(4, 4)

    message = change_after_initialize(stage, add)
    assert '"extra.weight"' in message and "added" in message


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_replaced_param_data_is_named(stage):
    def replace(model):
        model.body.weight.data = torch.zeros(4, 4)  # same shape, a new storage

    message = change_after_initialize(stage, replace)
    assert '"body.weight"' in message and "replaced" in message and "copy_" in message


@pytest.mark.parametrize("stage", [1, 3])
def test_a_param_unfrozen_after_initialize_is_named(stage):
    def unfreeze(model):
        model.frozen.weight.requires_grad_(True)

    message = change_after_initialize(stage, unfreeze)
    assert '"frozen.weight"' in message and "frozen" in message


# 7. Bad configs and sparse gradients -----------------------------------------------------

@pytest.mark.parametrize("config,key", [
    ({"loss_scale": []}, "loss_scale"),
    ({"loss_scale": {"mode": "dynamic", "initial_power": 5000}}, "loss_scale.initial_power"),
    ({"gradient_accumulation_steps": "x"}, "gradient_accumulation_steps"),
    ({"gradient_accumulation_steps": None}, "gradient_accumulation_steps"),
    ({"optimizer": {"lr": torch.ones(2)}}, "optimizer.lr"),
    ({"optimizer": {"lr": float("nan")}}, "optimizer.lr"),
    ({"optimizer": {"betas": {0.9, 0.99}}}, "optimizer.betas"),
    ({"guard": {"timeout_s": float("inf")}}, "guard.timeout_s")])
def test_a_bad_config_value_is_an_invalid_argument_naming_the_key(config, key):
    comm = zerort.local_group(1)[0]
    with pytest.raises(zerort.InvalidArgumentError) as raised:
        zerort.torch.initialize(bias_model(), config, comm)
    assert f'"{key}"' in str(raised.value)
    comm.close()


def test_a_tensor_in_the_config_is_its_number():
    """A one-element tensor (a learning rate computed with torch) is the number it holds."""
    engine, comm = one_rank(bias_model(), {"optimizer": {"type": "sgd",
                                                          "lr": torch.tensor(0.25)}})
    assert engine.get_lr() == [0.25]
    engine.close()
    comm.close()


@pytest.mark.parametrize("groups,words", [
    (lambda m: [{"params": m.parameters(), "betas": 5}], ["group 0", "betas"]),
    (lambda m: [{"params": 5}], ["group 0", "params"]),
    (lambda m: 5, ["model_parameters"])])
def test_bad_model_parameters_are_invalid_arguments(groups, words):
    model = bias_model()
    comm = zerort.local_group(1)[0]
    with pytest.raises(zerort.InvalidArgumentError) as raised:
        zerort.torch.initialize(model, {"stage": 2}, comm, model_parameters=groups(model))
    assert all(word in str(raised.value) for word in words)
    comm.close()


@pytest.mark.parametrize("stage", [0, 2])
def test_a_model_with_nothing_to_train_is_named_at_initialize(stage):
    """A LoRA model whose adapters were never unfrozen: the error says that every param is
    frozen and what to do, not that the engine has no params."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)).requires_grad_(False)
    comm = zerort.local_group(1)[0]
    with pytest.raises(zerort.InvalidArgumentError) as raised:
        zerort.torch.initialize(model, {"stage": stage}, comm)
    assert "requires_grad=False" in str(raised.value)
    assert "requires_grad=True" in str(raised.value)
    comm.close()


def test_sparse_embedding_is_refused_at_initialize():
    model = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 1))
    comm = zerort.local_group(1)[0]
    with pytest.raises(zerort.InvalidArgumentError) as raised:
        zerort.torch.initialize(model, {"stage": 2}, comm)
    assert '"0.weight"' in str(raised.value) and "sparse=False" in str(raised.value)
    model[0].requires_grad_(False)  # a frozen sparse embedding gives no gradient: fine
    zerort.torch.initialize(model, {"stage": 2}, comm).close()
    comm.close()


class FunctionalSparse(nn.Module):
    """A sparse gradient that initialize() cannot see coming (F.embedding(sparse=True))."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.ones(10, 4))

    def forward(self, tokens):
        return F.embedding(tokens, self.table, sparse=True).sum()


def test_a_sparse_gradient_is_named_when_it_arrives():
    model = FunctionalSparse()
    engine, comm = one_rank(model, {"stage": 2})
    with pytest.raises(zerort.InvalidArgumentError) as raised:
        model(torch.tensor([1, 2])).backward()
    assert '"table"' in str(raised.value) and "sparse" in str(raised.value)
    assert model.table.grad is None
    engine.close()
    comm.close()


# 8. Zero-element params ------------------------------------------------------------------

class WithEmpty(nn.Module):
    """A layer with no elements beside real ones (DeepSpeed's test_zero_empty_param)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(8, 8)
        self.empty = nn.Linear(8, 0)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x))).sum() + self.empty(x).sum()


def zero_element_batch(step):
    return torch.randn(8, 8, generator=torch.Generator().manual_seed(step))


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_element_params_train_as_no_ops(stage):
    model = WithEmpty()
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD["lr"])
    for step in range(3):
        optimizer.zero_grad()
        model(zero_element_batch(step)).backward()
        optimizer.step()
    want = {n: p.detach().clone() for n, p in model.named_parameters()}
    models = [WithEmpty() for _ in range(2)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, {
            "stage": stage, "optimizer": SGD, "stage3": {"persistence_threshold": 0}}, comm)
        for step in range(3):
            (model(zero_element_batch(step)[rank * 4:(rank + 1) * 4]) * 2).backward()
            engine.step()
            assert model.empty.weight.grad is None and model.empty.bias.grad is None
        state = engine.state_dict()
        assert state["empty.weight"].shape == (0, 8) and state["empty.bias"].shape == (0,)
        engine.close()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    for got in run_ranks(2, body):
        assert {n: t.shape for n, t in got.items()} == {n: t.shape for n, t in want.items()}
        assert_close({n: t for n, t in got.items() if t.numel()},
                     {n: t for n, t in want.items() if t.numel()})


# 16. guard.on_unused = "zero" with idle experts ------------------------------------------

LAYERS, EXPERTS, DIM = 4, 3, 8


class MixtureOfExperts(nn.Module):
    """Every layer runs all experts but one; which one idles changes per step (the same on
    every rank, as stage 3 gathers each module on every rank)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(
            nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(EXPERTS)) for _ in range(LAYERS))
        self.head = nn.Linear(DIM, 1)
        self.idle = 0

    def forward(self, x):
        for experts in self.layers:
            x = x + sum(torch.tanh(expert(x)) for index, expert in enumerate(experts)
                        if index != self.idle)
        return self.head(x)


def expert_batch(step):
    return torch.randn(8, DIM, generator=torch.Generator().manual_seed(step))


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("pool_buffers", [1, 2])
def test_idle_experts_do_not_exhaust_the_bucket_buffers(stage, pool_buffers):
    """Each idle expert has buckets of its own; they used to wait, each with a buffer,
    until backward ended: ResourceExhaustedError blaming out-of-order gradients. Params the
    outputs' graph does not reach are now marked ready as backward comes to them."""
    model = MixtureOfExperts()
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD["lr"])
    for step in range(4):
        model.idle = step % EXPERTS
        optimizer.zero_grad()
        model(expert_batch(step)).pow(2).mean().backward()
        optimizer.step()
    want = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = {"stage": stage, "optimizer": SGD, "stage3": {"persistence_threshold": 0},
              "buckets": {"first_bucket_elems": 64, "reduce_bucket_elems": 64,
                          "pool_buffers": pool_buffers},
              "guard": {"on_unused": "zero", "timeout_s": 30}}
    models = [MixtureOfExperts() for _ in range(2)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        for step in range(4):
            model.idle = step % EXPERTS
            model(expert_batch(step)[rank * 4:(rank + 1) * 4]).pow(2).mean().backward()
            engine.step()
        engine.close()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    for got in run_ranks(2, body):
        assert_close(got, want)


class Regularized(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.extra = nn.Linear(4, 4)  # used by the loss only

    def forward(self, x):
        return self.net(x)


def test_a_param_used_outside_forward_under_on_unused_zero_is_named():
    """A regularizer on a param that forward does not use: the outputs' graph does not
    reach it, so it is marked ready without a gradient when backward comes to it; a
    gradient that comes after that is a clear error (DDP: "marked ready twice")."""
    model = Regularized()
    engine, comm = one_rank(model, {"stage": 2, "optimizer": SGD,
                                    "guard": {"on_unused": "zero"}})
    with pytest.raises(zerort.FailedPreconditionError) as raised:
        penalty = model.extra.weight.square().sum()  # before forward: its gradient comes last
        (model(torch.ones(2, 4)).sum() + penalty).backward()
    message = str(raised.value)
    assert '"extra.weight"' in message and "outside the model's forward" in message
    engine.close()
    comm.close()


# 17. Frozen state whose shape differs across ranks ---------------------------------------

class WithBuffer(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("mask", torch.ones(size))

    def forward(self, x):
        return self.linear(x)


def test_frozen_state_of_another_shape_on_one_rank_is_named_on_every_rank():
    models = [WithBuffer(80), WithBuffer(81)]
    _, failures = run_ranks(2, lambda rank, comm: zerort.torch.initialize(
        models[rank], {"stage": 2, "guard": {"timeout_s": 30}}, comm), raise_first=False)
    for failure in failures:
        assert isinstance(failure, zerort.InvalidArgumentError), failure
        message = str(failure)
        assert "mask: shape (80,)" in message and "mask: shape (81,)" in message
        assert "rank 1" in message


# 18. engine.step() and optimizer.step() both called -------------------------------------

def test_a_second_step_with_nothing_between_names_the_double_step():
    """accelerate's DeepSpeed flow: engine.step() and then the loop's own optimizer.step().
    The second finds no gradient at all: the error says two steps were called (it blamed
    every param as unused, and its fix, guard.on_unused = "zero", stepped twice)."""
    model = bias_model()
    engine, comm = one_rank(model, {"stage": 2, "optimizer": SGD})
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    model(x).mean().backward()
    engine.step()
    with pytest.raises(zerort.FailedPreconditionError) as raised:
        engine.optimizer.step()
    assert "not both" in str(raised.value) and "optimizer.step()" in str(raised.value)
    engine.close()
    comm.close()


def test_a_step_after_zero_grad_dropped_the_micro_batch_names_the_zero_grad():
    """backward, optimizer.zero_grad(), step(): the zero_grad() dropped the micro-batch's
    gradients (as PyTorch's does); the step's error names it, not a second step() call."""
    model = bias_model()
    engine, comm = one_rank(model, {"stage": 2, "optimizer": SGD})
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    model(x).mean().backward()
    engine.optimizer.zero_grad()
    with pytest.raises(zerort.FailedPreconditionError, match="zero_grad.. dropped"):
        engine.step()
    model(x).mean().backward()  # the next micro-batch steps as usual
    assert engine.step() is not None
    engine.close()
    comm.close()


# 19. step() after a forward alone; params frozen after initialize ------------------------

def test_a_step_after_a_forward_without_backward_says_no_backward_ran():
    """It listed every param as unused, with the reentrant-checkpointing hint."""
    model = bias_model()
    engine, comm = one_rank(model, {"stage": 2, "optimizer": SGD})
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    model(x).mean()  # the loss is never backpropagated
    with pytest.raises(zerort.FailedPreconditionError, match="no backward has run"):
        engine.step()
    engine.close()
    comm.close()


def test_params_frozen_after_initialize_are_named_with_the_way_to_freeze():
    """The unused-parameters error for params frozen after initialize() names them and
    guard.on_unused = "zero" (not "freeze them", which the trainer just did); with it, they
    stay unchanged, as PyTorch's optimizers leave a param without a gradient."""
    for on_unused in ("error", "zero"):
        model = bias_model()
        engine, comm = one_rank(model, {"stage": 2, "optimizer": SGD,
                                        "guard": {"on_unused": on_unused}})
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
        model(x).mean().backward()
        engine.step()
        model.bias.requires_grad_(False)
        before = model.bias.detach().clone()
        model(x).mean().backward()
        if on_unused == "error":
            with pytest.raises(zerort.UnusedParametersError) as raised:
                engine.step()
            message = str(raised.value)
            assert '("bias") were frozen after initialize()' in message
            assert 'guard.on_unused = "zero"' in message and "use_reentrant" not in message
        else:
            engine.step()
            assert torch.equal(model.bias.detach(), before)
        engine.close()
        comm.close()


def test_a_save_inside_an_accumulation_window_names_the_boundary(tmp_path):
    model = bias_model()
    engine, comm = one_rank(model, {"stage": 2, "optimizer": SGD,
                                    "gradient_accumulation_steps": 2})
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    model(x).mean().backward()
    engine.step()
    with pytest.raises(zerort.FailedPreconditionError, match="accumulation boundary") as raised:
        engine.save_checkpoint(str(tmp_path))
    assert "1 of 2 micro-batches" in str(raised.value)
    model(x).mean().backward()
    engine.step()
    engine.save_checkpoint(str(tmp_path))  # at the boundary
    engine.close()
    comm.close()


def test_a_module_replaced_after_initialize_at_stage_3_is_named():
    """A head swapped after initialize() (as resize_token_embeddings does): at stage 3 the
    old module's units never get a gradient, and the gradient buffers ran out in backward
    with an error that blamed unused params; the pool now grows past them (logged), and the
    step's error names the new param."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 1))
    engine, comm = one_rank(model, {"stage": 3, "optimizer": SGD,
                                    "stage3": {"persistence_threshold": 0},
                                    "buckets": {"pool_buffers": 1}})
    model[2] = nn.LayerNorm(8)  # its units launch before the two Linears' before it
    model(torch.randn(2, 4)).sum().backward()
    with pytest.raises(zerort.FailedPreconditionError,
                       match='"2.weight" was added to the model after initialize'):
        engine.step()
    assert engine.counters()["pool_buffers_added"] > 0
    engine.close()
    comm.close()


@pytest.mark.parametrize("micro_batches", [3, 4])
def test_close_names_micro_batches_left_unstepped(micro_batches):
    """A rank that ran one micro-batch more than its peers steps other windows, which nothing
    else shows at stages 0-1: close() says how many micro-batches were never stepped, and
    stays silent after full windows (and after a forward alone)."""
    comm = zerort.local_group(1)[0]
    model = nn.Linear(4, 2)
    config = {"stage": 1, "optimizer": SGD, "gradient_accumulation_steps": 2}
    engine = zerort.torch.initialize(model, config, comm)
    for _ in range(micro_batches):
        engine.backward(model(torch.ones(3, 4)).sum())
        engine.step()
    with torch.no_grad():
        model(torch.ones(3, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.close()
    messages = [str(w.message) for w in caught if "never stepped" in str(w.message)]
    assert len(messages) == (1 if micro_batches % 2 else 0), messages
    if messages:
        assert "1 micro-batch(es)" in messages[0] and "same number" in messages[0]
    comm.close()


class _RaisesInBackward(torch.autograd.Function):
    """The identity, whose backward raises (a bad batch, a kernel that fails)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("the backward of this batch failed")


def test_a_caught_exception_from_backward_is_named_at_the_step():
    """A trainer that catches an exception from loss.backward() and goes on leaves that
    micro-batch's gradients incomplete: the error at step() says so, not reentrant
    checkpointing."""
    comm = zerort.local_group(1)[0]
    model = TinyLM()
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": OPTIMIZER}, comm)
    tokens, targets = batch(0)
    x = model.embed(tokens)
    for block in model.blocks:
        x = block(x)
    logits = model.head(_RaisesInBackward.apply(x))
    with pytest.raises(RuntimeError, match="failed"):
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
    loss_of(model, *batch(1)).backward()
    with pytest.raises(zerort.UnusedParametersError,
                       match="A backward on this rank raised before it finished"):
        engine.step()
    engine.close()
    comm.close()


def _bad_backward(model, rows):
    """A backward that raises after the head's gradients were handed over."""
    tokens, targets = rows
    x = model.embed(tokens)
    for block in model.blocks:
        x = block(_RaisesInBackward.apply(x) if block is model.blocks[-1] else x)
    logits = model.head(x)
    with pytest.raises(RuntimeError, match="failed"):
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()


def _skipping_equals_never_seeing(stage, models, lm_loss, skip, warm_up=False):
    """Two ranks train models[rank] with a batch skipped (`skip(model, engine, rank)`) and
    models[2 + rank] without it, the same two steps after (and one before with `warm_up`):
    the results must be equal."""
    def body(rank, comm):
        results = []
        for skipped, model in ((True, models[rank]), (False, models[2 + rank])):
            engine = zerort.torch.initialize(model, {"stage": stage, "optimizer": OPTIMIZER,
                                                     "guard": {"timeout_s": 30}}, comm)
            if warm_up:
                lm_loss(model, *batch(50 + rank)).backward()
                engine.step()
            if skipped:
                skip(model, engine, rank)
            for step in range(2):
                lm_loss(model, *batch(4 * step + rank)).backward()
                engine.step()
            results.append(engine.state_dict())
            engine.close()
        return results

    for skipped, clean in run_ranks(2, body):
        assert_close(skipped, clean)


@pytest.mark.parametrize("after", ["zero_grad", "step_then_zero_grad"])
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_batch_whose_backward_raised_is_skipped_by_zero_grad(stage, after):
    """The way out the step's error names: every rank skips the batch whose backward raised
    with optimizer.zero_grad() (after the refused step() or instead of it), and training
    goes on as if the batch never came (it stuck before: every later step() was refused)."""
    def skip(model, engine, rank):
        _bad_backward(model, batch(2 + rank))
        if after == "step_then_zero_grad":
            with pytest.raises(zerort.UnusedParametersError, match="raised before"):
                engine.step()
        engine.optimizer.zero_grad()

    _skipping_equals_never_seeing(stage, [TinyLM() for _ in range(4)], loss_of, skip)


class _RaisesAtOutput(nn.Module):
    """TinyLM whose output's backward raises when `bad` (before any param gradient)."""

    def __init__(self):
        super().__init__()
        self.lm = TinyLM()
        self.bad = False

    def forward(self, tokens):
        out = self.lm(tokens)
        return _RaisesInBackward.apply(out) if self.bad else out


@pytest.mark.parametrize("stage", [0, 3])
def test_a_batch_whose_backward_raised_on_one_rank_before_any_gradient_is_skipped(stage):
    """Rank 0's backward raises before any gradient reached the engine, rank 1's completes;
    both skip the batch with zero_grad() after a first step: rank 0 ends the micro-batch
    too (its missing gradients as zeros), so the ranks make the same reductions, and
    training equals a run that never saw the batch."""
    def lm_loss(model, tokens, targets):
        logits = model(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def skip(model, engine, rank):
        model.bad = rank == 0
        try:
            lm_loss(model, *batch(2 + rank)).backward()
        except RuntimeError:
            assert rank == 0
        model.bad = False
        engine.optimizer.zero_grad()

    _skipping_equals_never_seeing(stage, [_RaisesAtOutput() for _ in range(4)], lm_loss, skip,
                                  warm_up=True)


def test_an_unknown_dtype_in_the_core_api_is_named():
    """zerort.Engine.register_param with a dtype the library has not: InvalidArgumentError
    naming it and the dtypes there are (it was a bare KeyError)."""
    comm = zerort.local_group(1)[0]
    engine = zerort.Engine({"stage": 2}, comm)
    try:
        with pytest.raises(zerort.InvalidArgumentError, match="'fp64' is not one of fp32"):
            engine.register_param("w", (4,), dtype="fp64")
        assert engine.register_param("w", (4,), dtype="bf16") == 0
    finally:
        engine.close()
        comm.close()
