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
