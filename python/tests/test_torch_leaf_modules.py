"""Leaf modules at stage 3 (DeepSpeed's set_z3_leaf_modules): a mixture of experts whose
routing differs between ranks trains as single-process PyTorch once its MoE block is a leaf
(and fails with an error naming the way without it), a leaf's children are not hooked and
its subtree is gathered once per use, and the DeepSpeed config's leaf_module and
stage3_module_granularity_threshold flag the modules they name."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zerort
import zerort.torch
from test_torch_engine import assert_close, run_ranks

DIM, HIDDEN, EXPERTS, BATCH, STEPS = 16, 24, 4, 8, 4
OPTIMIZER = {"type": "adamw", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8,
             "weight_decay": 0.01}
# Every module's params sharded; an expert no token reached on a rank contributes zeros.
CONFIG = {"stage": 3, "optimizer": OPTIMIZER, "stage3": {"persistence_threshold": 0},
          "guard": {"timeout_s": 30, "on_unused": "zero"}}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def route_of(x):
    """Each row's expert: the largest of its first EXPERTS features."""
    return x[:, :EXPERTS].argmax(dim=1)


class MoEBlock(nn.Module):
    """Experts behind a router (`route`: each row's expert): only the experts that got rows
    run."""

    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, DIM))
            for _ in range(EXPERTS))

    def forward(self, x, route):
        out = torch.zeros_like(x)
        for expert in route.unique().tolist():
            rows = route == expert
            out = out.index_put((rows,), self.experts[expert](x[rows]))
        return out


class MoEModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(DIM, DIM)
        self.moe = MoEBlock()
        self.head = nn.Linear(DIM, 1)

    def forward(self, x):
        h = self.embed(x)
        return self.head(h + self.moe(h, route_of(x)))


def batch(step):
    """Rows whose first half routes to experts 0-1 and second half to experts 2-3: with two
    ranks, each rank's rows reach experts the other's do not (expert 0, registered first
    of them, on rank 0 only)."""
    generator = torch.Generator().manual_seed(300 + step)
    x = torch.randn(BATCH, DIM, generator=generator) * 0.1
    for row in range(BATCH):
        x[row, (row * EXPERTS) // BATCH] += 8.0
    return x, torch.randn(BATCH, 1, generator=generator)


def loss_of(model, x, y):
    return F.mse_loss(model(x), y)


def reference():
    model = MoEModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIMIZER["lr"],
                                  betas=OPTIMIZER["betas"], eps=OPTIMIZER["eps"],
                                  weight_decay=OPTIMIZER["weight_decay"])
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, *batch(step)).backward()
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def train(world, mark, config=CONFIG):
    """Trains MoEModel on `world` in-process ranks, each on its rows of every batch;
    `mark(model)` runs before initialize(). Returns rank 0's full params."""
    models = [MoEModel() for _ in range(world)]
    assert route_of(batch(0)[0]).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]

    def body(rank, comm):
        model = models[rank]
        mark(model)
        engine = zerort.torch.initialize(model, config, comm)
        rows = slice(BATCH * rank // world, BATCH * (rank + 1) // world)
        for step in range(STEPS):
            x, y = batch(step)
            loss_of(model, x[rows], y[rows]).backward()
            engine.step()
        state = engine.state_dict()
        engine.close()
        return state

    return run_ranks(world, body)[0]


def test_a_mixture_of_experts_routed_apart_trains_as_pytorch_as_a_leaf():
    got = train(2, lambda model: zerort.torch.set_z3_leaf_modules(model, [MoEBlock]))
    assert_close(got, reference())


class ReadingExpert(nn.Module):
    """An expert that also reads another module's param (the embedding's weight)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, x, embed):
        return self.proj(x) + F.linear(x, embed.weight)


class ReadingMoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(ReadingExpert() for _ in range(EXPERTS))

    def forward(self, x, embed, route):
        out = torch.zeros_like(x)
        for expert in route.unique().tolist():
            rows = route == expert
            out = out.index_put((rows,), self.experts[expert](x[rows], embed))
        return out


class ReadingModel(nn.Module):
    """An embedding, a leaf MoE whose experts read the embedding's weight, a head; expert
    1 frozen."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(DIM, DIM)
        self.moe = ReadingMoE()
        self.head = nn.Linear(DIM, 1)
        self.moe.experts[1].requires_grad_(False)

    def forward(self, x):
        h = self.embed(x)
        return self.head(h + self.moe(h, self.embed, route_of(x)))


def test_experts_that_read_outside_params_or_are_frozen_train_as_pytorch_routed_apart():
    """The ranks reach other experts at each step (each rank its half of a batch routed
    by step), some frozen, some reading the embedding through its module: the read is
    gathered by the leaf, never by a hooked expert, and the job trains as PyTorch."""
    def step_batch(step):
        x, y = batch(step)
        return x.roll(step * BATCH // EXPERTS, dims=0), y

    want = ReadingModel()
    optimizer = torch.optim.AdamW([p for p in want.parameters() if p.requires_grad],
                                  lr=OPTIMIZER["lr"], betas=OPTIMIZER["betas"],
                                  eps=OPTIMIZER["eps"], weight_decay=OPTIMIZER["weight_decay"])
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(want, *step_batch(step)).backward()
        optimizer.step()
    models = [ReadingModel() for _ in range(2)]

    def body(rank, comm):
        model = models[rank]
        zerort.torch.set_z3_leaf_modules(model, [ReadingMoE])
        engine = zerort.torch.initialize(model, CONFIG, comm)
        rows = slice(BATCH * rank // 2, BATCH * (rank + 1) // 2)
        for step in range(STEPS):
            x, y = step_batch(step)
            loss_of(model, x[rows], y[rows]).backward()
            engine.step()
            assert not any(sub._forward_pre_hooks for sub in model.moe.modules()
                           if sub is not model.moe)
        state = engine.state_dict()
        engine.close()
        return state

    got = run_ranks(2, body)[0]
    assert_close(got, {n: p.detach() for n, p in want.named_parameters()})


def test_without_the_leaf_the_ranks_experts_mismatch_and_the_error_names_the_leaf():
    with pytest.raises(zerort.ZeroError) as failure:
        train(2, lambda model: None)
    assert "set_z3_leaf_modules" in str(failure.value), failure.value


def test_a_leaf_is_one_unit_its_children_have_no_hooks_and_it_gathers_once_per_use():
    model = MoEModel()
    flagged = zerort.torch.set_z3_leaf_modules(model, ["MoEBlock"])
    assert flagged == [model.moe] and zerort.torch.get_z3_leaf_modules(model) == flagged
    assert zerort.torch.z3_leaf_module(model.moe)
    engine = zerort.torch.initialize(model, CONFIG, zerort.local_group(1)[0])
    assert not any(sub._forward_pre_hooks for sub in model.moe.modules() if sub is not model.moe)
    assert model.moe._forward_pre_hooks and model.embed._forward_pre_hooks
    x, y = batch(0)
    for _ in range(3):  # the second step and on follow the recorded order
        before = engine.counters()
        loss_of(model, x, y).backward()
        engine.step()
    after = engine.counters()
    gathers = sum(after[key] - before[key] for key in ("gathers_prefetched", "gathers_on_demand"))
    # Three units (embed, the whole MoE block, head), each gathered for its forward and, as
    # far as the engine did not keep it, again for its backward.
    assert 3 <= gathers <= 6, after
    engine.close()


def test_leaves_by_name_suffix_fully_qualified_class_and_unset():
    model = MoEModel()
    found, missing = zerort.torch.set_z3_leaf_modules_by_name(model, ["moe", "nothing"],
                                                               raise_if_not_found=False)
    assert found == [model.moe] and missing == ["nothing"]
    zerort.torch.unset_z3_leaf_modules(model, [f"{__name__}.MoEBlock"])
    assert not zerort.torch.get_z3_leaf_modules(model)
    found, missing = zerort.torch.set_z3_leaf_modules_by_suffix(model, ["experts.1"])
    assert found == [model.moe.experts[1]] and not missing
    zerort.torch.set_z3_leaf_modules_by_suffix(model, ["experts.1"], flag=False)
    assert not zerort.torch.get_z3_leaf_modules(model)
    with pytest.raises(zerort.InvalidArgumentError, match="no module of the model is a Conv"):
        zerort.torch.set_z3_leaf_modules(model, ["Conv"])
    with pytest.raises(zerort.InvalidArgumentError, match="named 'moe.gate'"):
        zerort.torch.set_z3_leaf_modules_by_name(model, ["moe.gate"])


def deepspeed_config(**zero):
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_clipping": 0.0,
            "optimizer": {"type": "AdamW", "params": {
                key: OPTIMIZER[key] for key in ("lr", "betas", "eps", "weight_decay")}},
            "zero_optimization": dict({"stage": 3, "stage3_param_persistence_threshold": 0,
                                       "ignore_unused_parameters": True}, **zero)}


def test_a_deepspeed_configs_leaf_module_flags_what_it_names_and_warns_of_the_rest():
    config = deepspeed_config(leaf_module={"classes": ["MoEBlock", "NoSuchBlock"]})
    assert_close(train(2, lambda model: None, config), reference())  # the block was a leaf
    model = MoEModel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        zerort.torch.initialize(model, config, zerort.local_group(1)[0]).close()
    assert zerort.torch.get_z3_leaf_modules(model) == [model.moe]
    assert any("'NoSuchBlock'" in str(w.message) for w in caught), [str(w.message) for w in caught]
    with pytest.raises(zerort.InvalidArgumentError, match="leaf_module.names must be a list"):
        zerort.torch.initialize(MoEModel(), deepspeed_config(leaf_module={"names": 3}),
                                zerort.local_group(1)[0])
    model = MoEModel()  # a refused config flags nothing
    with pytest.raises(zerort.InvalidArgumentError, match="granularity_threshold must be"):
        zerort.torch.initialize(model, deepspeed_config(
            leaf_module={"names": ["moe"]}, stage3_module_granularity_threshold=True),
            zerort.local_group(1)[0])
    assert not zerort.torch.get_z3_leaf_modules(model)


def test_the_granularity_threshold_flags_the_outermost_fine_grained_modules():
    """DeepSpeed's stage3_module_granularity_threshold: a module's params over the layers of
    its subtree (modules with params and no children, and each other module with children
    but no container). The MoE block: 4 × (16*24+24 + 24*16+16) = 3232 params over 8
    Linear layers and itself, 359. Its experts (Sequential) and their list are containers,
    never leaves, and so is the Sequential around the block here."""
    for threshold, leaves in ((359, 1), (358, 0)):
        model = nn.Sequential(MoEBlock())
        zerort.torch.initialize(
            model, deepspeed_config(stage3_module_granularity_threshold=threshold),
            zerort.local_group(1)[0]).close()
        assert zerort.torch.get_z3_leaf_modules(model) == [model[0]] * leaves, threshold
