"""guard.on_unused = "zero" at stage 3 when ranks reach different params of one module (each
row takes one of two params, and each rank's rows take another): the module's unreached
params are marked as its backward begins, at the same point on every rank, so every rank's
collectives come in the same order, and training equals single-process PyTorch. Marked as
backward came to them instead, the rank that did not reach a param completed its bucket
after the next unit's gather, its peer before it: a collective mismatch. With gradient
accumulation, prefetches stop at the end of the micro-batch (see the last test)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zerort
import zerort.torch
from test_torch_engine import assert_close, run_ranks

DIM, BATCH, STEPS = 16, 8, 4
OPTIMIZER = {"type": "adamw", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8,
             "weight_decay": 0.01}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


class TwoWays(nn.Module):
    """Each row is multiplied by one of two params, `a` where its route is true, else `b`
    (matrices, or vectors scaling each feature; `b` None: the row passes as it is): a param
    no row takes is not reached. The result is gated by a Linear of its own (`inner`),
    whose backward (its unit's gather) comes between the start of the module's backward
    and the gradients of `a` and `b`."""

    def __init__(self, matrices, with_b=True):
        super().__init__()
        shape = (DIM, DIM) if matrices else (DIM,)
        self.a = nn.Parameter(torch.randn(shape) * 0.3)
        self.b = nn.Parameter(torch.randn(shape) * 0.3) if with_b else None
        self.matrices = matrices
        self.inner = nn.Linear(DIM, DIM)

    def forward(self, x, route):
        out = torch.zeros_like(x)
        for take_a in route.unique().tolist():
            rows = route == take_a
            param = self.a if take_a else self.b
            if param is None:
                out = out.index_put((rows,), x[rows])
            else:
                out = out.index_put((rows,), x[rows] @ param if self.matrices
                                    else x[rows] * param)
        return out * torch.sigmoid(self.inner(x))


class Model(nn.Module):
    """embed, ways, mid and head, run in that order. `ways_last`: `ways` registered after
    head, its unit first in the buckets' launch order (reverse registration order); with
    `a` alone in it, a rank that does not reach `a` completed the unit as head's gradient
    arrived, when marked as backward came to it, and launched its reduce-scatter before
    mid's gather, while its peer launched it in ways' backward, after that gather."""

    def __init__(self, matrices, with_b=True, ways_last=False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(DIM, DIM)
        if not ways_last:
            self.ways = TwoWays(matrices, with_b)
        self.mid = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, 1)
        if ways_last:
            self.ways = TwoWays(matrices, with_b)

    def forward(self, x):
        h = torch.tanh(self.ways(self.embed(x), x[:, 0] > 0))
        return self.head(torch.tanh(self.mid(h)))


def batch(step):
    """Rows whose first half routes one way and second half the other (rank 0's rows to
    `a` on even steps, to `b` on odd ones)."""
    generator = torch.Generator().manual_seed(500 + step)
    x = torch.randn(BATCH, DIM, generator=generator)
    x[:, 0] = x[:, 0].abs() + 0.1
    x[(BATCH // 2 if step % 2 == 0 else 0):][:BATCH // 2, 0] *= -1
    return x, torch.randn(BATCH, 1, generator=generator)


def reference(*model_args):
    model = Model(*model_args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIMIZER["lr"],
                                  betas=OPTIMIZER["betas"], eps=OPTIMIZER["eps"],
                                  weight_decay=OPTIMIZER["weight_decay"])
    for step in range(STEPS):
        optimizer.zero_grad()
        x, y = batch(step)
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("matrices, with_b, ways_last, persistence", [
    (True, True, False, 0), (False, True, False, 300), (True, False, True, 0),
    (False, False, True, 300)],
    ids=["sharded", "persistent", "sharded-a-alone-first", "persistent-a-alone-first"])
def test_ranks_reaching_other_params_of_a_module_train_as_pytorch(matrices, with_b,
                                                                   ways_last, persistence):
    """`sharded`: every unit sharded; `persistent`: the two-way module's unit is kept
    gathered (its vectors fall below stage3.persistence_threshold), the Linears' units are
    sharded. No unit is kept for its backward, so the backward gathers every sharded
    unit."""
    config = {"stage": 3, "optimizer": OPTIMIZER,
              "stage3": {"persistence_threshold": persistence, "max_reuse_elems": 0,
                         "prefetch_elems": 0},
              "guard": {"timeout_s": 30, "on_unused": "zero"}}
    world = 2
    models = [Model(matrices, with_b, ways_last) for _ in range(world)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        rows = slice(BATCH * rank // world, BATCH * (rank + 1) // world)
        for step in range(STEPS):
            x, y = batch(step)
            route = (x[rows, 0] > 0).unique().tolist()
            assert route == [rank == step % 2]  # each rank reaches one of a, b
            F.mse_loss(model(x[rows]), y[rows]).backward()
            engine.step()
        state = engine.state_dict()
        engine.close()
        return state

    got = run_ranks(world, body)[0]
    assert_close(got, reference(matrices, with_b, ways_last))


def test_with_gradient_accumulation_and_prefetching():
    """Two micro-batches per step (each rank's rows split in two), prefetching and keeping
    on (the defaults): a rank that did not reach `a` (alone in its module's unit) releases
    the unit as the module's backward begins, its peer when a's gradient arrives; a
    prefetch of the next micro-batch's units from a gather between the two was made by one
    rank only (a collective mismatch) until prefetching stopped at the micro-batch's end."""
    config = {"stage": 3, "optimizer": OPTIMIZER, "gradient_accumulation_steps": 2,
              "stage3": {"persistence_threshold": 0},
              "guard": {"timeout_s": 30, "on_unused": "zero"}}
    world = 2
    models = [Model(True, with_b=False) for _ in range(world)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        for step in range(STEPS):
            x, y = batch(step)
            for half in range(2):
                quarter = 2 * rank + half
                rows = slice(BATCH * quarter // 4, BATCH * (quarter + 1) // 4)
                engine.backward(F.mse_loss(model(x[rows]), y[rows]))
                engine.step()
        assert engine.counters()["gathers_prefetched"] > 0
        state = engine.state_dict()
        engine.close()
        return state

    got = run_ranks(world, body)[0]
    assert_close(got, reference(True, False))


def assert_trains_as_pytorch(build, train, config):
    """`train(model, step_once)` of a model from `build()`: with torch AdamW in one process
    (a param without a gradient left untouched), and through the engine (`config`) on two
    in-process ranks that see the same rows, gives the same params."""
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIMIZER["lr"],
                                  betas=OPTIMIZER["betas"], eps=OPTIMIZER["eps"],
                                  weight_decay=OPTIMIZER["weight_decay"])

    def torch_step():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    train(model, torch_step)
    expected = {n: p.detach().clone() for n, p in model.named_parameters()}
    models = [build() for _ in range(2)]

    def body(rank, comm):
        engine = zerort.torch.initialize(models[rank], config, comm)
        try:
            train(models[rank], engine.step)
            return engine.state_dict()
        finally:
            engine.close()

    assert_close(run_ranks(2, body)[0], expected)


class ReadDetached(nn.Linear):
    """A Linear whose weight trains but is read detached here: its backward needs the
    weight for the input's gradient, and the weight gets none."""

    def forward(self, x):
        return F.linear(x, self.weight.detach(), self.bias)


class Scale(nn.Module):
    """x times a weight of its own, elementwise: its backward reads the param itself (a
    Linear's reads a view of it)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(DIM) + 0.5)

    def forward(self, x):
        return x * self.weight


class Chain(nn.Module):
    """embed, mid and head; `mid` a Linear, a Scale, or a ReadDetached Linear."""

    def __init__(self, mid):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(DIM, DIM)
        self.mid = {"linear": lambda: nn.Linear(DIM, DIM), "scale": Scale,
                    "detached": lambda: ReadDetached(DIM, DIM, bias=False)}[mid]()
        self.head = nn.Linear(DIM, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.mid(torch.tanh(self.embed(x)))))


@pytest.mark.parametrize("how,mid", [("frozen-after-initialize", "linear"),
                                     ("frozen-after-initialize", "scale"),
                                     ("read-detached", "detached")])
def test_a_unit_without_gradients_stays_readable_for_its_modules_backward(how, mid):
    """Every param of mid's unit is marked as mid's backward begins (frozen since step 1,
    or read detached), which released the unit before mid's backward read its weight for
    the input's gradient (PyTorch's "setStorage ... out of bounds"; NaN where the backward
    reads the param itself, as Scale's does, and the param had its placeholder). Both ranks
    see the same rows, so training equals single-process PyTorch."""
    config = {"stage": 3, "optimizer": OPTIMIZER,
              "stage3": {"persistence_threshold": 0, "max_reuse_elems": 0,
                         "prefetch_elems": 0},
              "guard": {"timeout_s": 30, "on_unused": "zero"}}

    def train(model, step_once):
        for step in range(STEPS):
            if step == 1 and how == "frozen-after-initialize":
                model.mid.requires_grad_(False)
            x, y = batch(step)
            F.mse_loss(model(x), y).backward()
            step_once()

    assert_trains_as_pytorch(lambda: Chain(mid), train, config)


class ScaledBase(nn.Module):
    """x times its own `a` (where the caller says so) through a frozen Linear child (a LoRA
    job's base): the child's gather comes inside this module's backward."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(DIM) * 0.3)
        self.base = nn.Linear(DIM, DIM)
        self.base.requires_grad_(False)

    def forward(self, x, use_a):
        return torch.tanh(self.base(x * self.a if use_a else x))


class WithScaledBase(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(DIM, DIM)
        self.scaled = ScaledBase()
        self.head = nn.Linear(DIM, 1)

    def forward(self, x, use_a):
        return self.head(self.scaled(torch.tanh(self.embed(x)), use_a))


def test_a_module_reaching_its_param_on_some_ranks_around_a_frozen_child_trains_as_a_leaf():
    """Rank 0 reaches `a`, rank 1 does not, and the frozen child's gather comes inside the
    module's backward: hooked apart, rank 1 completes a's bucket before that gather and
    rank 0 after it (the mismatch's note names the leaf); as a leaf, the module and its
    child are one unit, and training equals single-process PyTorch over both ranks' rows."""
    config = {"stage": 3, "optimizer": OPTIMIZER,
              "stage3": {"persistence_threshold": 0, "max_reuse_elems": 0,
                         "prefetch_elems": 0},
              "guard": {"timeout_s": 30, "on_unused": "zero"}}
    model = WithScaledBase()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=OPTIMIZER["lr"], betas=OPTIMIZER["betas"],
                                  eps=OPTIMIZER["eps"], weight_decay=OPTIMIZER["weight_decay"])
    for step in range(STEPS):
        x, y = batch(step)
        halves = [slice(0, BATCH // 2), slice(BATCH // 2, BATCH)]
        loss = sum(F.mse_loss(model(x[rows], rank == 0), y[rows])
                   for rank, rows in enumerate(halves)) / 2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    expected = {n: p.detach().clone() for n, p in model.named_parameters()}

    def train(leaf):
        models = [WithScaledBase() for _ in range(2)]

        def body(rank, comm):
            if leaf:
                zerort.torch.set_z3_leaf_modules(models[rank], [ScaledBase])
            engine = zerort.torch.initialize(models[rank], config, comm)
            rows = slice(BATCH // 2 * rank, BATCH // 2 * (rank + 1))
            try:
                for step in range(STEPS):
                    x, y = batch(step)
                    F.mse_loss(models[rank](x[rows], rank == 0), y[rows]).backward()
                    engine.step()
                return engine.state_dict()
            finally:
                engine.close()

        return run_ranks(2, body)[0]

    assert_close(train(leaf=True), expected)
    with pytest.raises(zerort.ZeroError, match="frozen child"):
        train(leaf=False)


class Gate(nn.Module):
    """x through its own weight where the caller says so, else x as it is."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(DIM, DIM) * 0.1)

    def forward(self, x, use):
        return F.linear(x, self.weight) + x if use else x * 1.0


class GatedChain(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.gate = Gate()
        self.head = nn.Linear(DIM, 1, bias=False)

    def forward(self, x, use):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(self.gate(x, use))


@pytest.mark.parametrize("live_units", [2, 3])
def test_ranks_reaching_other_params_keep_the_same_live_window(live_units):
    """Rank 0 reaches the gate's weight, rank 1 does not: rank 1 marks it as the gate's
    backward begins. The engine releases the unit there, as when its gradient arrives on
    rank 0 (keeping it gathered on rank 1 alone until the backward pass ended made the ranks'
    live elements differ, and under a binding stage3.max_live_elems one rank prefetched a
    gather the other made later: a collective mismatch). Training equals PyTorch's."""
    config = {"stage": 3, "optimizer": OPTIMIZER,
              "stage3": {"persistence_threshold": 0, "max_reuse_elems": 0,
                         "prefetch_elems": 10 * DIM * DIM,
                         "max_live_elems": live_units * DIM * DIM},
              "guard": {"timeout_s": 30, "on_unused": "zero"}}
    model = GatedChain()
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIMIZER["lr"],
                                  betas=OPTIMIZER["betas"], eps=OPTIMIZER["eps"],
                                  weight_decay=OPTIMIZER["weight_decay"])
    halves = [slice(0, BATCH // 2), slice(BATCH // 2, BATCH)]
    for step in range(STEPS):
        x, y = batch(step)
        loss = sum(F.mse_loss(model(x[rows], rank == 0), y[rows])
                   for rank, rows in enumerate(halves)) / 2
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    expected = {n: p.detach().clone() for n, p in model.named_parameters()}
    models = [GatedChain() for _ in range(2)]

    def body(rank, comm):
        engine = zerort.torch.initialize(models[rank], config, comm)
        try:
            for step in range(STEPS):
                x, y = batch(step)
                rows = halves[rank]
                F.mse_loss(models[rank](x[rows], rank == 0), y[rows]).backward()
                engine.step()
            return engine.state_dict()
        finally:
            engine.close()

    assert_close(run_ranks(2, body)[0], expected)


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.heads = nn.ModuleList(nn.Linear(DIM, 1) for _ in range(2))

    def forward(self, x):
        h = self.second(torch.tanh(self.first(x)))
        return [head(h) for head in self.heads]


def test_a_storage_kept_for_a_backward_is_not_freed_while_the_engine_prefetched_it():
    """Two backward passes over one forward (retain_graph), one per head, the trunk frozen
    after initialize() and prefetching on: a trunk unit whose storage was kept for its backward
    was prefetched again by the engine in the first pass, and freed as that pass ended while
    the engine held it; the second pass read 0 bytes (a segmentation fault). Training equals
    PyTorch's."""
    config = {"stage": 3, "optimizer": OPTIMIZER,
              "stage3": {"persistence_threshold": 0, "max_reuse_elems": 0,
                         "prefetch_elems": 10 * DIM * DIM},
              "guard": {"timeout_s": 30, "on_unused": "zero"}}

    def train(model, step_once):
        model.first.requires_grad_(False)  # after initialize(): each head's pass trains it
        model.second.requires_grad_(False)
        for step in range(STEPS):
            x, y = batch(step)
            first, second = model(x.requires_grad_())
            F.mse_loss(first, y).backward(retain_graph=True)
            F.mse_loss(second, y).backward()
            step_once()

    assert_trains_as_pytorch(TwoHeads, train, config)
