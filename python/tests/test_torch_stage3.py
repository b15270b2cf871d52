"""Stage 3 for a LoRA job on in-process ranks: the frozen base is sharded with its modules'
units, training equals single-process PyTorch, a tied output layer reads the embedding
through F.linear (register_external_parameter), gathered() reads and writes full values,
and an eval pass does not end prefetching."""
import copy
import dataclasses
import inspect
import io
import json
import math
import os
import pathlib
import subprocess

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zerort
import zerort.torch
from test_torch_engine import assert_close, run_ranks

VOCAB, DIM, RANK, BLOCKS, BATCH, SEQ, STEPS = 32, 128, 1, 3, 12, 4, 4
OPTIMIZER = {"type": "adamw", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8,
             "weight_decay": 0.01}
# The adapters (128 elements a unit) stay gathered; the base projections (16,512) and the
# embedding (4,096) are sharded.
CONFIG = {"stage": 3, "optimizer": OPTIMIZER, "stage3": {"persistence_threshold": 1000},
          "guard": {"timeout_s": 30}}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


class LoraLinear(nn.Module):
    """A frozen projection plus a trainable rank-1 adapter."""

    def __init__(self):
        super().__init__()
        self.base = nn.Linear(DIM, DIM)
        self.base.requires_grad_(False)
        self.lora_a = nn.Linear(DIM, RANK, bias=False)
        self.lora_b = nn.Linear(RANK, DIM, bias=False)
        nn.init.normal_(self.lora_b.weight, std=0.1)  # PEFT starts at 0; then A gets none

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x))


class LoraLM(nn.Module):
    """A frozen embedding and LayerNorms, LoRA blocks, and an output layer that is the
    embedding (tied): F.linear(h, self.embed.weight), as GPT-style models compute it.
    97 % of the params are frozen."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.norms = nn.ModuleList(nn.LayerNorm(DIM) for _ in range(BLOCKS))
        self.blocks = nn.ModuleList(LoraLinear() for _ in range(BLOCKS))
        self.embed.requires_grad_(False)
        self.norms.requires_grad_(False)
        zerort.torch.register_external_parameter(self, self.embed.weight)

    def forward(self, tokens):
        x = self.embed(tokens)
        for norm, block in zip(self.norms, self.blocks):
            x = x + torch.tanh(block(norm(x)))
        return F.linear(x, self.embed.weight)


def batch(step):
    generator = torch.Generator().manual_seed(200 + step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    targets = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    return tokens, targets


def loss_of(model, tokens, targets):
    return F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))


def trainable(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def frozen(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()
            if not p.requires_grad}


def reference():
    model = LoraLM()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=OPTIMIZER["lr"], betas=OPTIMIZER["betas"],
                                  eps=OPTIMIZER["eps"],
                                  weight_decay=OPTIMIZER["weight_decay"])
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, *batch(step)).backward()
        optimizer.step()
    return trainable(model), frozen(LoraLM())


def storage_bytes(model):
    """Bytes of the model's own param storages now (each storage once)."""
    seen, total = set(), 0
    for param in model.parameters():
        storage = (param.untyped_storage() if hasattr(param, "untyped_storage")
                   else param.storage())
        key = storage.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def train_steps(model, engine, rank, world, after_step=lambda: None):
    """STEPS steps of `model` as rank `rank` of `world`, each on its rows of the batch
    (weighted so that the ranks' mean is the whole batch's loss)."""
    bounds = [BATCH * r // world for r in range(world + 1)]
    mine = slice(bounds[rank], bounds[rank + 1])
    weight = (bounds[rank + 1] - bounds[rank]) * world / BATCH
    for step in range(STEPS):
        tokens, targets = batch(step)
        (weight * loss_of(model, tokens[mine], targets[mine])).backward()
        engine.step()
        after_step()


def train_lora_job(model, rank, world, comm):
    """Trains `model` as rank `rank` of `world` on its rows of each batch; returns what
    check_lora_job compares."""
    engine = zerort.torch.initialize(model, CONFIG, comm)
    held = []
    train_steps(model, engine, rank, world, lambda: held.append(storage_bytes(model)))
    params_bytes = engine.memory_stats()["params"][0]
    state = engine.state_dict()
    engine.close()
    return trainable(model), frozen(model), state, held, params_bytes


def check_lora_job(result, world):
    """Training equals PyTorch's; the frozen base is unchanged and whole after close() and
    in state_dict(); between steps the model's storages hold under 10 % of the model and
    the engine's params about 1/world of it."""
    want_trained, want_frozen = reference()
    model_bytes = sum(p.numel() * p.element_size() for p in LoraLM().parameters())
    got_trained, got_frozen, state, held, params_bytes = result
    assert_close(got_trained, want_trained)
    assert_close(got_frozen, want_frozen)
    assert_close({n: state[n] for n in want_frozen}, want_frozen)
    assert max(held) < 0.10 * model_bytes, (held, model_bytes)
    assert params_bytes <= 1.3 * model_bytes / world, (params_bytes, model_bytes)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_lora_job_shards_its_frozen_base_and_trains_as_pytorch(world):
    models = [LoraLM() for _ in range(world)]
    results = run_ranks(world, lambda rank, comm: train_lora_job(models[rank], rank, world,
                                                                 comm))
    for result in results:
        check_lora_job(result, world)


def test_an_undeclared_tied_layer_is_found_as_it_reads_the_embedding():
    """Without register_external_parameter the root's forward reads the embedding's
    released weight: it is gathered then, and around the root's forward from then on;
    training equals PyTorch's and prefetching continues after the first step."""
    world = 2
    models = [LoraLM() for _ in range(world)]
    for model in models:
        del model.__dict__["_zerort_external_params"]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, CONFIG, comm)
        prefetched = []
        train_steps(model, engine, rank, world,
                    lambda: prefetched.append(engine.counters()["gathers_prefetched"]))
        invalidations = engine.counters()["trace_invalidations"]
        engine.close()
        return trainable(model), prefetched, invalidations

    want_trained, _ = reference()
    for trained, prefetched, invalidations in run_ranks(world, body):
        assert_close(trained, want_trained)
        assert prefetched[-1] > prefetched[-2] > 0 and invalidations <= 1, (
            prefetched, invalidations)


class ListHeldHead(nn.Module):
    """Reads another module's weight held in a Python list: no attribute read to see."""

    def __init__(self, weight):
        super().__init__()
        self.weights = [weight]

    def forward(self, hidden):
        return F.linear(hidden, self.weights[0])


def test_a_param_read_through_a_list_warns_at_the_first_step_its_nan_reaches(recwarn):
    """The read finds the released unit's placeholder (NaN) and the model trains to NaN;
    nothing said why. The step that applies the NaN gradient warns, naming the cause and
    register_external_parameter, once."""
    torch.manual_seed(0)
    embed, middle = nn.Linear(4, 4, bias=False), nn.Linear(4, 4)
    model = nn.Sequential(embed, nn.Tanh(), middle, ListHeldHead(embed.weight))
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(model, {"stage": 3, "stage3": {"persistence_threshold": 0},
                                             "optimizer": {"type": "sgd", "lr": 0.1}}, comm)
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        engine.step()
    warned = [str(w.message) for w in recwarn if "register_external_parameter" in str(w.message)]
    assert len(warned) == 1 and "norm is nan" in warned[0], warned
    engine.close()
    comm.close()


def test_gathered_reads_full_values_and_writes_from_the_modifier_rank():
    world = 3
    models = [LoraLM() for _ in range(world)]
    want = frozen(LoraLM())["blocks.1.base.weight"]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, CONFIG, comm)
        weight = model.blocks[1].base.weight
        assert torch.isnan(weight).all()  # between uses: a placeholder, no values
        with zerort.torch.gathered(weight) as (values,):
            read = values.detach().clone()
        with zerort.torch.gathered([weight, model.blocks[1].lora_a.weight],
                                   modifier_rank=1):
            with torch.no_grad():
                weight.fill_(float(rank + 1))  # only rank 1's write counts
        with zerort.torch.gathered(weight):
            written = weight.detach().clone()
        tokens, targets = batch(0)
        loss_of(model, tokens, targets).backward()  # trains on from the written values
        engine.step()
        state = engine.state_dict()
        engine.close()
        return read, written, state["blocks.1.base.weight"]

    for read, written, stated in run_ranks(world, body):
        assert torch.equal(read, want)
        assert torch.equal(written, torch.full_like(want, 2.0))
        assert torch.equal(stated, written)  # frozen: the step leaves it as written



@pytest.mark.parametrize("stage", [2, 3])
def test_a_write_in_a_block_without_modifier_rank_warns_naming_the_param(stage, recwarn):
    """FSDP's summon_full_params writes back; gathered() without modifier_rank, as
    DeepSpeed's GatheredParameters, applies no write: at stage 3 it was gone silently."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(model, {"stage": stage, "optimizer": SGD,
                                             "stage3": {"persistence_threshold": 0}}, comm)
    with zerort.torch.gathered(list(model.parameters())):
        pass  # a read: no warning
    with zerort.torch.gathered(list(model.parameters())):
        with torch.no_grad():
            model[1].weight.fill_(3.0)
    warned = [str(w.message) for w in recwarn if "modifier_rank" in str(w.message)]
    assert len(warned) == 1 and '"1.weight"' in warned[0], warned
    engine.close()
    comm.close()

@pytest.mark.parametrize("stage", [2, 3])
def test_a_modifier_block_that_raises_on_one_rank_raises_on_every_rank(stage):
    """No rank's values are broadcast, and the ranks whose block ended well raise too,
    instead of going on to a collective the failed rank never makes."""
    world = 3
    models = [LoraLM() for _ in range(world)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, dict(CONFIG, stage=stage), comm)
        weight = model.blocks[1].lora_a.weight
        error = ValueError if rank == 1 else zerort.AbortedError
        with pytest.raises(error, match="rank 1's data" if rank == 1 else "another rank"):
            with zerort.torch.gathered(weight, modifier_rank=0):
                with torch.no_grad():
                    weight.add_(1.0)  # rank 0's: applied had every block ended well
                if rank == 1:
                    raise ValueError("rank 1's data is bad")
        with zerort.torch.gathered(weight, modifier_rank=0):  # the ranks go on together
            pass
        tokens, targets = batch(0)
        loss_of(model, tokens, targets).backward()
        engine.step()
        engine.close()

    run_ranks(world, body)


def test_an_eval_pass_in_the_middle_keeps_prefetching():
    comm = zerort.local_group(1)[0]
    model = LoraLM()
    engine = zerort.torch.initialize(model, CONFIG, comm)
    prefetched = []
    for step in range(6):
        if step == 3:
            with torch.no_grad():
                model(batch(99)[0][:, :2])  # an eval pass, gathers of its own
        before = engine.counters()["gathers_prefetched"]
        loss_of(model, *batch(step)).backward()
        engine.step()
        prefetched.append(engine.counters()["gathers_prefetched"] - before)
    # From the second step on, including the one right after the eval pass.
    assert min(prefetched[1:]) > 0 and prefetched[4:] == [prefetched[2]] * 2, prefetched
    assert engine.counters()["trace_invalidations"] == 0
    engine.close()
    comm.close()


@pytest.mark.parametrize("between", ["nothing", "checkpoint and writes"])
@pytest.mark.parametrize("world", [1, 2])
def test_a_forward_whose_backward_never_comes_trains_as_without_it(world, between, tmp_path):
    """A forward with autograd on whose loss is dropped (an eval pass without no_grad)
    releases its units until a backward that never comes: the engine keeps them gathered
    (releases_kept). The next step's forward uses them (no gather off the recorded order)
    and the training is bit-for-bit that of a run without the dropped forward; so is it
    when a checkpoint is saved after it, a gathered() write without modifier_rank (dropped)
    and one with modifier_rank=0 (applied, in both runs) are made."""
    models = {dropped: [LoraLM() for _ in range(world)] for dropped in (False, True)}

    def body(rank, comm, dropped):
        model = models[dropped][rank]
        engine = zerort.torch.initialize(model, CONFIG, comm)
        kept, invalidations, prefetched = 0, 0, 0
        for step in range(STEPS):
            if step == 2:
                counters = engine.counters()
                if dropped:
                    loss_of(model, *batch(99))  # its backward never runs
                    kept = engine.counters()["releases_kept"] - counters["releases_kept"]
                if between != "nothing":
                    engine.save_checkpoint(tmp_path / f"{int(dropped)}", tag="mid")
                    embed = model.embed.weight
                    with zerort.torch.gathered(embed):
                        before = embed.detach().clone()
                        embed.add_(1.0)  # no modifier_rank: dropped at the block's end
                    with zerort.torch.gathered(embed):
                        assert torch.equal(embed, before)
                    weight = model.blocks[1].base.weight
                    with zerort.torch.gathered(weight, modifier_rank=0):
                        if rank == 0:
                            weight.mul_(0.5)
            tokens, targets = batch(step)
            mine = slice(BATCH * rank // world, BATCH * (rank + 1) // world)
            loss_of(model, tokens[mine], targets[mine]).backward()
            engine.step()
            if step == 2:
                invalidations = (engine.counters()["trace_invalidations"]
                                 - counters["trace_invalidations"])
                prefetched = (engine.counters()["gathers_prefetched"]
                              - counters["gathers_prefetched"])
        engine.close()
        return kept, invalidations, prefetched, trainable(model), frozen(model)

    plain = run_ranks(world, lambda rank, comm: body(rank, comm, False))
    dropped = run_ranks(world, lambda rank, comm: body(rank, comm, True))
    for want, got in zip(plain, dropped):
        kept, invalidations, prefetched = got[:3]
        assert kept > 0
        if between == "nothing":
            assert invalidations == 0 and prefetched >= want[2] > 0, (got[:3], want[:3])
        for name in want[3]:
            assert torch.equal(got[3][name], want[3][name]), name
        for name in want[4]:
            assert torch.equal(got[4][name], want[4][name]), name


def test_ranks_running_different_modules_of_one_size_fail():
    """Rank r runs block r: the blocks' base units have one size, so only the unit each
    gather carries tells them apart; both ranks get an error naming both. The storage each
    failed gather was lent is kept for good (the broken collective might still write it)."""
    from zerort.torch import _params, _stage3
    kept = len(_stage3._KEPT_AFTER_CLOSE)
    models = [LoraLM() for _ in range(2)]

    def body(rank, comm):
        engine = zerort.torch.initialize(models[rank], CONFIG, comm)
        try:
            with torch.no_grad():
                models[rank].blocks[rank](torch.ones(1, DIM))
        finally:
            try:
                engine.close()
            except zerort.ZeroError:
                pass  # the group is broken: close() cannot gather either

    _, failures = run_ranks(2, body, raise_first=False)
    for failure in failures:
        assert isinstance(failure, zerort.InvalidArgumentError), failure
        assert "mismatch" in str(failure) and "tag=" in str(failure), failure
    now_kept = _stage3._KEPT_AFTER_CLOSE[kept:]
    assert len(now_kept) >= 2 and all(_params.storage_bytes(flat) for flat in now_kept)


def shard_bytes(model):
    """Bytes of the slices init_context keeps for `model`'s params."""
    return sum(p._zerort_init_shard.numel() * p.element_size() for p in model.parameters()
               if getattr(p, "_zerort_init_shard", None) is not None)


SGD = {"type": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0}


def sgd_reference_from(initial):
    """PyTorch SGD (momentum 0.9) on the whole batch from the params `initial` ({name:
    tensor}). SGD's step is proportional to the gradient, so it carries no rounding
    difference of a near-zero gradient into a whole step, as Adam's sign-like first steps
    can from an arbitrary initialisation."""
    model = LoraLM()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(initial[name])
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad],
                                lr=SGD["lr"], momentum=SGD["momentum"])
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, *batch(step)).backward()
        optimizer.step()
    return trainable(model)


@pytest.mark.parametrize("stage", [2, 3])
def test_init_context_builds_a_model_no_rank_holds_whole(stage):
    """Built inside init_context, each rank holds a third of the model (its slices) and no
    param storage; initialize() puts it together one param at a time (rank 0's values on
    every rank) and training equals PyTorch's from those values. (The rank threads share
    PyTorch's generator, so rank 0's initial values are not LoraLM()'s.)"""
    world = 3
    model_bytes = sum(p.numel() * p.element_size() for p in LoraLM().parameters())

    def body(rank, comm):
        with zerort.torch.init_context(comm):
            model = LoraLM()
        built = storage_bytes(model), shard_bytes(model)
        engine = zerort.torch.initialize(model, dict(CONFIG, stage=stage, optimizer=SGD), comm)
        initial = engine.state_dict()  # trainable (and at stage 3 frozen) params, whole
        initial.update({n: p.detach().clone() for n, p in model.named_parameters()
                        if n not in initial})
        train_steps(model, engine, rank, world)
        engine.close()
        return built, initial, trainable(model)

    results = run_ranks(world, body)
    want = sgd_reference_from(results[0][1])
    for (storages, shards), initial, trained in results:
        # (each param keeps a one-element placeholder)
        assert storages < 0.01 * model_bytes and shards <= 1.01 * model_bytes / world, (
            storages, shards)
        assert_close(initial, results[0][1])
        assert_close(trained, want)


def test_modules_built_outside_the_block_are_whole():
    comm = zerort.local_group(1)[0]
    with zerort.torch.init_context(comm):
        pass
    model = LoraLM()
    assert shard_bytes(model) == 0 and storage_bytes(model) > 0
    comm.close()


class PostInitLM(LoraLM):
    """A Hugging Face-style model: its __init__ ends with post_init(), which writes every
    module's weights through self.apply(self._init_weights)."""

    def __init__(self):
        super().__init__()
        self.post_init()

    def post_init(self):
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=1.0, std=0.01)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=-1.0, std=0.01)


def test_init_context_runs_a_post_init_over_the_sharded_modules():
    """post_init's apply() inside init_context (it raised on the placeholders) gives
    _init_weights each module's params whole; every rank ends with rank 0's values, sharded,
    and initialize() puts them together."""
    world = 3

    def body(rank, comm):
        with zerort.torch.init_context(comm):
            model = PostInitLM()
        built = storage_bytes(model)
        engine = zerort.torch.initialize(model, dict(CONFIG, optimizer=SGD), comm)
        with zerort.torch.gathered(list(model.parameters())):
            values = {n: p.detach().clone() for n, p in model.named_parameters()}
        engine.close()
        return built, values

    results = run_ranks(world, body)
    model_bytes = sum(p.numel() * p.element_size() for p in LoraLM().parameters())
    for built, values in results:
        assert built < 0.01 * model_bytes, built
        assert_close(values, results[0][1])
        for name, value in values.items():
            if name.endswith("bias"):
                assert torch.count_nonzero(value) == 0, name
            elif "embed" in name:
                assert (value + 1.0).abs().max() < 0.1, name
            elif "norm" not in name:
                assert (value - 1.0).abs().max() < 0.1, name


def test_a_block_inside_another_changes_nothing():
    """A composite model's from_pretrained builds its parts each under its own zero.Init
    inside the outer one (it was refused): the inner block shards nothing of its own, and
    the model is built as in one block."""
    def body(rank, comm):
        with zerort.torch.init_context(comm):
            with zerort.torch.init_context(comm):
                inner = LoraLM()
            with zerort.torch.init_context():
                outer = LoraLM()
        with zerort.torch.init_context(comm):
            with pytest.raises(zerort.InvalidArgumentError, match="same ranks"):
                with zerort.torch.init_context(zerort.local_group(1)[0]):
                    pass
        return storage_bytes(inner), storage_bytes(outer)

    model_bytes = sum(p.numel() * p.element_size() for p in LoraLM().parameters())
    for built in run_ranks(2, body):
        assert max(built) < 0.01 * model_bytes, built


def test_a_write_between_the_block_and_initialize_is_refused_on_every_rank():
    """nn.init.constant_ after the block reached the placeholder, read back as written and
    was lost at initialize(): it is refused there, naming the param, on the rank that wrote
    and on its peer."""
    def body(rank, comm):
        with zerort.torch.init_context(comm):
            model = LoraLM()
        if rank == 0:
            torch.nn.init.constant_(model.embed.weight, 0.5)
        else:
            model.blocks[0].base.weight.data.fill_(0.5)  # through .data: no version moves
        with pytest.raises(zerort.FailedPreconditionError) as raised:
            zerort.torch.initialize(model, CONFIG, comm)
        return str(raised.value)

    messages = run_ranks(2, body)
    assert '"embed.weight"' in messages[0] and "gathered(params, modifier_rank=0)" in messages[0]
    assert '"blocks.0.base.weight"' in messages[1]


def test_a_pretrained_state_dict_loads_after_initialize_and_is_refused_before():
    """model.load_state_dict() between the block and initialize() would write placeholders
    (PyTorch's "more than one element of the written-to tensor" per param): refused, naming
    the param and engine.load_module_state_dict, which loads it after initialize()."""
    pretrained = LoraLM().state_dict()

    def body(rank, comm):
        with zerort.torch.init_context(comm):
            model = LoraLM()
        with pytest.raises(zerort.FailedPreconditionError) as raised:
            model.load_state_dict(pretrained)
        assert '"embed.weight"' in str(raised.value), str(raised.value)
        assert "load_module_state_dict" in str(raised.value)
        engine = zerort.torch.initialize(model, CONFIG, comm)
        engine.load_module_state_dict(pretrained)
        state = engine.module_state_dict()
        engine.close()
        return state

    for state in run_ranks(2, body):
        assert all(torch.equal(state[name], value) for name, value in pretrained.items())


def test_init_context_without_comm_takes_the_launchers_ranks():
    with zerort.torch.init_context():
        model = LoraLM()
    assert storage_bytes(model) < 0.01 * shard_bytes(model)  # one rank: a slice is a param
    engine = zerort.torch.initialize(model, CONFIG)
    engine.close()


def test_a_rank_whose_loss_skips_the_model_is_told_how_to_run_its_backward():
    """At stage 3 a rank whose loss does not depend on the model's outputs (no targets in
    its batch) makes none of the backward's gathers: the collective mismatch it meets names
    that, and the fix (outputs.sum() * 0), on that rank and its peer."""
    models = [LoraLM() for _ in range(2)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, dict(CONFIG, guard={"timeout_s": 30,
                                                                    "on_unused": "zero"}), comm)
        tokens, targets = batch(0)
        loss = loss_of(model, tokens, targets)
        if rank == 1:
            loss = torch.zeros((), requires_grad=True) * 0.0
        with pytest.raises(zerort.InvalidArgumentError, match=r"outputs.sum\(\) \* 0"):
            loss.backward()
            engine.step()
        with pytest.raises(zerort.InvalidArgumentError, match="group is broken"):
            engine.close()  # its gathers of the whole params are collectives too

    run_ranks(2, body)


class Twice(nn.Module):
    """A frozen module whose output is its own next input: f(f(x))."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.pre = nn.Linear(16, 16)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.frozen(self.frozen(self.pre(x))).pow(2).sum()


def test_a_frozen_module_called_twice_in_a_row_keeps_its_unit_for_both_backwards():
    """The second call's input-gradient hook fires before the first call's backward: the
    frozen unit stays until no call's backward needs it (it was released too early)."""
    def run(stage):
        comm = zerort.local_group(1)[0]
        model = Twice()
        engine = zerort.torch.initialize(
            model, {"stage": stage, "optimizer": SGD, "stage3": {"persistence_threshold": 0}},
            comm)
        for step in range(3):
            model(torch.randn(4, 16, generator=torch.Generator().manual_seed(step))).backward()
            engine.step()
        engine.close()
        comm.close()
        return trainable(model)

    assert_close(run(3), run(2))


@dataclasses.dataclass
class Hidden:
    """A module output that is a dataclass."""
    values: torch.Tensor


class Boxed:
    """A module output of a kind no traversal knows (the tensor in an attribute)."""

    def __init__(self, values):
        self.values = values


@pytest.mark.parametrize("box,middle", [(Hidden, "trains"), (Boxed, "trains"),
                                        (Boxed, "frozen"), (Boxed, "frozen after initialize")])
def test_a_module_returning_its_output_in_an_object_keeps_its_unit_for_backward(box, middle):
    """A unit whose module returns a dataclass (walked into), or an object no walk can see
    into (the unit stays gathered until its gradients arrive; a frozen one until its inputs'
    gradient is computed): its backward finds its params (it found an empty storage), at 2
    ranks, as at stage 2. Nothing stays gathered after the backward (a unit frozen after
    initialize() waited for gradients that never come)."""
    class Middle(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(16, 16) / 4)

        def forward(self, h):
            return box(torch.tanh(h @ self.weight))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(2)
            self.first, self.middle, self.last = nn.Linear(16, 16), Middle(), nn.Linear(16, 1)

        def forward(self, x):
            return self.last(self.middle(self.first(x)).values).pow(2).sum()

    def run(stage):
        models = [Model() for _ in range(2)]  # built here: the ranks' threads share the RNG
        for model in models:
            if middle == "frozen":
                model.middle.requires_grad_(False)

        def body(rank, comm):
            model = models[rank]
            engine = zerort.torch.initialize(
                model, {"stage": stage, "optimizer": SGD, "guard": {"on_unused": "zero"},
                        "stage3": {"persistence_threshold": 0}}, comm)
            if middle == "frozen after initialize":
                model.middle.requires_grad_(False)
            for step in range(3):
                generator = torch.Generator().manual_seed(10 * step + rank)
                model(torch.randn(4, 16, generator=generator)).backward()
                if stage == 3:
                    assert engine.memory_stats()["gathered"][0] == 0, "a unit stayed gathered"
                engine.step()
            engine.close()
            comm.close()
            return trainable(model)
        return run_ranks(2, body)[0]

    assert_close(run(3), run(2))


def test_gathered_below_stage3_writes_frozen_params_and_a_raising_rank_writes_nothing():
    world = 2
    models = [LoraLM() for _ in range(world)]

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, dict(CONFIG, stage=2), comm)
        with zerort.torch.gathered(list(model.parameters()), modifier_rank=1):
            with torch.no_grad():
                model.embed.weight.fill_(rank + 1.0)  # frozen: the model's own at stage 2
        written = model.embed.weight.detach().clone()
        before = model.blocks[0].lora_a.weight.detach().clone()
        raised = None
        try:
            with zerort.torch.gathered(model.blocks[0].lora_a.weight, modifier_rank=0):
                with torch.no_grad():
                    model.blocks[0].lora_a.weight.add_(rank + 1.0)  # at stage 2 the engine's
                if rank == 0:
                    raise KeyError("a rank fails inside the block")
        except (KeyError, zerort.AbortedError) as error:
            raised = type(error)  # rank 1's block ended well: it raises too
        kept = engine.state_dict()["blocks.0.lora_a.weight"]
        engine.close()
        return written, kept - before, raised

    for rank, (written, change, raised) in enumerate(run_ranks(world, body)):
        assert torch.equal(written, torch.full_like(written, 2.0))
        assert raised == (KeyError if rank == 0 else zerort.AbortedError)
        # Rank 0 raised, so no rank took rank 0's values: each kept its own edit (rank 1
        # would have rank 0's +1 had the writes gone ahead without rank 0).
        assert torch.allclose(change, torch.full_like(change, rank + 1.0)), rank


def read_safetensors(path):
    """{name: float32 tensor} of an F32 safetensors file (zero-ckpt consolidate's output)."""
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(length))
        data = file.read()
    header.pop("__metadata__", None)
    result = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        values = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        result[name] = values.reshape(entry["shape"])
    return result


@pytest.mark.parametrize("stage", [2, 3])
def test_save_frozen_puts_the_frozen_base_in_checkpoints(stage, tmp_path):
    """checkpoint.save_frozen: training is unchanged (below stage 3 the engine keeps the
    frozen params and the model views them); the checkpoint loads the frozen base into a
    model whose base differs, at another world size and stage; zero-ckpt consolidate
    returns it."""
    config = dict(CONFIG, stage=stage, checkpoint={"save_frozen": True})
    want_trained, want_frozen = reference()
    models = [LoraLM() for _ in range(2)]  # the rank threads share torch's generator

    def train(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        train_steps(model, engine, rank, comm.size)
        engine.save_checkpoint(tmp_path / "ckpt")
        engine.close()
        return trainable(model)

    for trained in run_ranks(2, train):
        assert_close(trained, want_trained)

    models = [LoraLM() for _ in range(3)]
    for model in models:
        with torch.no_grad():
            for name in frozen(model):
                model.get_parameter(name).fill_(0.5)

    def load(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, dict(config, stage=5 - stage), comm)
        engine.load_checkpoint(tmp_path / "ckpt")
        state = engine.state_dict()
        engine.close()
        return state, frozen(model)

    for state, loaded in run_ranks(3, load):
        assert_close({n: state[n] for n in want_trained}, want_trained)
        assert_close(loaded, want_frozen)
    tool = pathlib.Path(os.environ.get("ZERORT_LIBRARY", "")).parent.parent / "bin" / "zero-ckpt"
    if not tool.exists():
        pytest.skip(f"{tool} not built")
    out = tmp_path / "model.safetensors"
    subprocess.run([str(tool), "consolidate", str(tmp_path / "ckpt"), "--out", str(out)],
                   check=True, capture_output=True)
    consolidated = read_safetensors(out)
    assert_close({n: consolidated[n] for n in want_frozen}, want_frozen)
    assert_close({n: consolidated[n] for n in want_trained}, want_trained)


class Raising(nn.Module):
    """Raises inside its forward when `fail` is set."""

    def __init__(self):
        super().__init__()
        self.fail = False

    def forward(self, x):
        if self.fail:
            raise ValueError("a forward that raises")
        return x


def test_a_forward_that_raised_leaves_no_module_gathering_what_is_read_later():
    """A read of a released param right after a forward raised is outside every forward: no
    module takes its unit on, and training goes on."""
    comm = zerort.local_group(1)[0]
    model = LoraLM()
    model.blocks[0].raising = Raising()
    inner = model.blocks[0].forward
    model.blocks[0].forward = lambda x: inner(model.blocks[0].raising(x))
    engine = zerort.torch.initialize(model, CONFIG, comm)
    loss_of(model, *batch(0)).backward()
    engine.step()
    hooked = {m: list(u) for m, u in engine._units._module_units.items()}
    model.blocks[0].raising.fail = True
    with pytest.raises(ValueError):
        loss_of(model, *batch(1))
    model.blocks[0].raising.fail = False
    weight = model.blocks[1].base.weight  # released: read outside every forward
    assert not engine._units.is_gathered(engine._units._unit_of_param[id(weight)])
    assert {m: list(u) for m, u in engine._units._module_units.items()} == hooked
    loss_of(model, *batch(1)).backward()
    engine.step()
    engine.close()
    comm.close()



class ReadingHead(nn.Module):
    """Owns no params: reads another module's weight, so PyTorch calls it without hooks."""

    def __init__(self, source):
        super().__init__()
        self.source = [source]  # not a submodule

    def forward(self, x):
        return F.linear(x, self.source[0].weight)


class HeadModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.body = nn.Linear(DIM, DIM)
        self.head = ReadingHead(self.embed)

    def forward(self, tokens):
        return self.head(torch.tanh(self.body(self.embed(tokens))))


@pytest.mark.parametrize("eval_first", [True, False])
def test_a_read_in_a_module_called_without_hooks_trains_and_an_eval_pass_releases_it(
        eval_first):
    """The module reading the embedding has no hooks of the engine's; until the model's
    first forward ends it has one that does nothing, so PyTorch runs the hooks the read adds
    during that call: the unit is released as the call ends, and gathered again for its
    backward (after an eval pass, it is released too). Training equals PyTorch's either
    way."""
    def train(use_engine):
        model = HeadModel()
        comm = zerort.local_group(1)[0] if use_engine else None
        config = {"stage": 3, "optimizer": SGD, "stage3": {"persistence_threshold": 0}}
        engine = zerort.torch.initialize(model, config, comm) if use_engine else None
        optimizer = None if use_engine else torch.optim.SGD(
            model.parameters(), lr=SGD["lr"], momentum=SGD["momentum"])
        released_after_eval = None
        if use_engine and eval_first:  # the first read is in an eval pass
            with torch.no_grad():
                model(batch(9)[0])
            units = engine._units
            released_after_eval = not units.is_gathered(units.units_of(
                [pid for name, _, pid in engine._params if name == "embed.weight"])[0])
        for step in range(STEPS):
            if optimizer is not None:
                optimizer.zero_grad()
            loss_of(model, *batch(step)).backward()
            (engine or optimizer).step()
        if use_engine:
            engine.close()
            comm.close()
        return trainable(model), released_after_eval

    got, released = train(True)
    want, _ = train(False)
    assert_close(got, want)
    assert released or not eval_first


class CastingBlock(nn.Module):
    """Owns no params: reads its frozen child's weight for its dtype (as LoRA wrappers cast
    their input), so PyTorch would call it without hooks."""

    def __init__(self):
        super().__init__()
        self.base = nn.Linear(DIM, DIM)
        self.base.requires_grad_(False)
        self.adapter = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        return x + torch.tanh(self.base(x.to(self.base.weight.dtype)) + self.adapter(x))


def test_a_read_for_the_dtype_in_the_first_forward_releases_the_unit_with_its_caller():
    """The first forward's read (the unit released) made a module called without hooks hold
    the unit until the step: every block's base at once in step 0, more than a
    max_live_elems of two units allows. Until the first forward ends every module has a
    hook, so the read is released as its caller's forward ends, as in later steps."""
    blocks = 4
    config = {"stage": 3, "optimizer": OPTIMIZER,
              "stage3": {"persistence_threshold": 0, "prefetch_elems": 0, "max_reuse_elems": 0,
                         "max_live_elems": 2 * (DIM * DIM + DIM)}}
    comm = zerort.local_group(1)[0]
    torch.manual_seed(5)
    model = nn.Sequential(*[CastingBlock() for _ in range(blocks)])
    engine = zerort.torch.initialize(model, config, comm)
    gathered = []
    for step in range(2):
        x = torch.randn(3, DIM, generator=torch.Generator().manual_seed(step))
        loss = model(x).pow(2).mean()
        gathered.append(engine.memory_stats()["gathered"][0])
        loss.backward()
        engine.step()
    assert gathered[0] == gathered[1], gathered
    engine.close()
    comm.close()


def test_memory_the_torch_side_cannot_lend_fails_the_gather_with_its_cause():
    """An exception while lending a unit's storage (out of memory) fails that gather with a
    ZeroError caused by it; training goes on once memory can be lent again."""
    comm = zerort.local_group(1)[0]
    model = LoraLM()
    engine = zerort.torch.initialize(model, CONFIG, comm)
    units = engine._units
    lend = units._lend

    def out_of_memory(unit, nbytes):
        raise RuntimeError(f"out of memory: {nbytes} bytes for unit {unit}")

    units._lend = out_of_memory
    with pytest.raises(zerort.ResourceExhaustedError, match="lender gave no memory") as info:
        loss_of(model, *batch(0))
    assert "out of memory" in str(info.value.__cause__)
    units._lend = lend
    units.release_all()
    loss_of(model, *batch(0)).backward()
    engine.step()
    engine.close()
    comm.close()


def test_a_healthy_close_gives_all_lent_memory_back():
    """After an eval pass (whose gathers prefetch the next units), close() leaves no unit's
    storage behind: only memory a broken collective may still write into is kept."""
    from zerort.torch import _params, _stage3
    kept = len(_stage3._KEPT_AFTER_CLOSE)
    comm = zerort.local_group(1)[0]
    model = LoraLM()
    engine = zerort.torch.initialize(model, CONFIG, comm)
    for step in range(2):
        loss_of(model, *batch(step)).backward()
        engine.step()
    with torch.no_grad():
        loss_of(model, *batch(2))
    assert engine.counters()["gathers_prefetched"] > 0
    flats = list(engine._units._flats.values())
    assert any(_params.storage_bytes(flat) for flat in flats)  # prefetched, still lent
    engine.close()
    assert len(_stage3._KEPT_AFTER_CLOSE) == kept
    assert not any(_params.storage_bytes(flat) for flat in flats)
    assert engine.engine.closed
    comm.close()


def test_model_state_dict_between_uses_is_refused_and_names_the_ways():
    """model.state_dict() of sharded params between uses would save tensors without storage
    (a file torch.load cannot read); load_state_dict() would write into an empty storage.
    Both are errors naming the ways; inside gathered() and after close() they work."""
    comm = zerort.local_group(1)[0]
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    model.register_buffer("grid", torch.arange(4.0).expand(3, 4))  # no storage of its size
    engine = zerort.torch.initialize(
        model, {"stage": 3, "optimizer": SGD, "stage3": {"persistence_threshold": 0}}, comm)
    model(torch.randn(4, 8)).sum().backward()
    engine.step()
    full = engine.state_dict()
    with pytest.raises(zerort.FailedPreconditionError,
                       match=r"engine\.module_state_dict\(\)") as raised:
        model.state_dict()
    assert '"0.weight"' in str(raised.value)
    with pytest.raises(zerort.FailedPreconditionError, match="modifier_rank"):
        model.load_state_dict(full)
    with zerort.torch.gathered(list(model.parameters()), modifier_rank=0):
        inside = {n: v.clone() for n, v in model.state_dict().items() if n in full}
        model.load_state_dict({n: v * 2 for n, v in full.items()}, strict=False)
    assert_close(inside, full)
    engine.close()
    comm.close()
    after = {n: v for n, v in model.state_dict().items() if n in full}
    assert_close(after, {n: v * 2 for n, v in full.items()})


def test_reading_or_casting_a_sharded_param_between_uses_is_never_a_crash():
    """Between uses a sharded param's .data is a placeholder of its shape: what a trainer
    does there with plain PyTorch (log norms, clone, keep an EMA, cast for evaluation, re-init
    a bias) reads NaN or is a clear error, never a read past a storage of no bytes (it was a
    segmentation fault). Nothing the engine holds changes, and training goes on."""
    comm = zerort.local_group(1)[0]
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    engine = zerort.torch.initialize(
        model, {"stage": 3, "optimizer": SGD, "stage3": {"persistence_threshold": 0}}, comm)
    x = torch.randn(4, 8)

    def train_step():
        model(x).sum().backward()
        engine.step()

    train_step()
    full = engine.state_dict()
    norms = [p.norm().item() for p in model.parameters()]
    assert all(math.isnan(n) for n in norms)
    assert torch.isnan(model[0].weight.detach().clone()).all()
    assert torch.isnan(nn.utils.parameters_to_vector(model.parameters())).all()
    assert "nan" in str(model[2].bias)
    ema = [torch.zeros(p.shape) for p in model.parameters()]
    with torch.no_grad():
        for average, param in zip(ema, model.parameters()):
            average.mul_(0.9).add_(param, alpha=0.1)  # NaN: read gathered() instead
    assert_close(engine.state_dict(), full)  # the engine's values are untouched
    with torch.no_grad():
        nn.init.zeros_(model[0].bias)  # a write between uses: lost, and said so
    with pytest.raises(zerort.FailedPreconditionError, match="written in place between uses"):
        train_step()
    train_step()  # said once; training goes on
    model.half()  # a cast between uses: the next use names it
    with pytest.raises(zerort.FailedPreconditionError, match="float32 -> torch.float16"):
        train_step()
    engine.close()
    comm.close()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_copy_of_the_model_carries_none_of_the_engine(stage):
    """copy.deepcopy(model) (an EMA or evaluation copy) and torch.save(model) after
    initialize(): the copy holds the values and runs none of the engine's hooks, so it
    evaluates and trains on its own while the engine trains on as if it did not exist. At
    stage 3 a copy between uses would hold NaN placeholders: refused, naming gathered()."""
    comm = zerort.local_group(1)[0]
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    twin = copy.deepcopy(model)  # trained alone, with no copy made
    config = {"stage": stage, "optimizer": SGD, "stage3": {"persistence_threshold": 0}}
    engine = zerort.torch.initialize(model, config, comm)
    twin_comm = zerort.local_group(1)[0]
    twin_engine = zerort.torch.initialize(twin, config, twin_comm)
    x = torch.randn(4, 8)
    for m, e in ((model, engine), (twin, twin_engine)):
        m(x).sum().backward()
        e.step()
    if stage == 3:
        with pytest.raises(zerort.FailedPreconditionError, match="gathered"):
            copy.deepcopy(model)
        with pytest.raises(zerort.FailedPreconditionError, match="gathered"):
            torch.save(model, io.BytesIO())
    with zerort.torch.gathered(list(model.parameters())):
        ema = copy.deepcopy(model)
        saved = io.BytesIO()
        torch.save(model, saved)
        expected = model(x).detach()
    options = {}
    if "weights_only" in inspect.signature(torch.load).parameters:
        options["weights_only"] = False  # a whole model
    loaded = torch.load(io.BytesIO(saved.getvalue()), **options)
    for other in (ema, loaded):
        torch.testing.assert_close(other(x), expected)
        other(x).sum().backward()  # trains alone: no engine call
        with torch.no_grad():
            for p in other.parameters():
                p.sub_(p.grad)
    for _ in range(2):
        for m, e in ((model, engine), (twin, twin_engine)):
            m(x).sum().backward()
            e.step()
    trained, alone = engine.state_dict(), twin_engine.state_dict()
    for name, value in alone.items():
        assert torch.equal(trained[name], value), name
    for e, c in ((engine, comm), (twin_engine, twin_comm)):
        e.close()
        c.close()
