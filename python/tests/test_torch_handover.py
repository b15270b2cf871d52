"""zerort.torch hands gradients to the engine in batches (_handover.py): small params' gradients
go in one library call per backward pass (at stage 3 one per unit), the training is bit for
bit that of one call per gradient, and a small batch limit hands over as it fills.
The ranks are threads (zerort.local_group)."""
import pytest
import torch

import zerort.torch
from test_torch_engine import OPTIMIZER, STEPS, TinyLM, batch, loss_of, run_ranks

WORLD = 3  # not a power of two


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def count_calls(engine):
    """Records each hand-over call of `engine`'s core.Engine: a list of the ids it carried."""
    core = engine.engine
    calls = []
    batched, single = core.accumulate_grads, core.accumulate_grad

    def accumulate_grads(pids, *args):
        calls.append(list(pids))
        return batched(pids, *args)

    def accumulate_grad(pid, *args):
        calls.append([pid])
        return single(pid, *args)

    core.accumulate_grads, core.accumulate_grad = accumulate_grads, accumulate_grad
    return calls


def train(stage, batch_elems=None, world=WORLD):
    """Each rank's params after STEPS steps, and its hand-over calls per step; `batch_elems`
    replaces the engine's batch limit (None: its own)."""
    config = {"stage": stage, "optimizer": OPTIMIZER, "guard": {"timeout_s": 30},
              "stage3": {"persistence_threshold": 0}}
    models = [TinyLM() for _ in range(world)]

    def body(rank, comm):
        engine = zerort.torch.initialize(models[rank], config, comm)
        if batch_elems is not None:
            engine._queue.limit = batch_elems
        calls = count_calls(engine)
        per_step = []
        bytes_in = engine.engine.counters()["grad_bytes_copied"]
        for step in range(STEPS):
            tokens, targets = batch(step)
            loss_of(models[rank], tokens[rank::world], targets[rank::world]).backward()
            # All handed over as backward returns (the pass's end), not at the step.
            now = engine.engine.counters()["grad_bytes_copied"]
            assert now - bytes_in == 4 * sum(
                p.numel() for p in models[rank].parameters() if p.requires_grad)
            bytes_in = now
            per_step.append(list(calls))
            del calls[:]
            engine.step()
        engine.close()
        trained = {n: p.detach().clone() for n, p in models[rank].named_parameters()
                   if p.requires_grad}
        return trained, per_step, len(engine._params)

    return run_ranks(world, body)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_a_backward_hands_small_gradients_over_in_one_call(stage):
    for _, per_step, params in train(stage):
        for calls in per_step:
            assert len(calls) == 1 and sorted(calls[0]) == list(range(params)), calls


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_batches_train_bit_for_bit_as_one_call_per_gradient(stage):
    batched = train(stage)
    one_by_one = train(stage, batch_elems=0)
    for (trained, _, _), (alone, per_step, params) in zip(batched, one_by_one):
        assert all(len(calls) == params and all(len(c) == 1 for c in calls)
                   for calls in per_step)
        for name, value in trained.items():
            assert torch.equal(value, alone[name]), name


def test_a_small_limit_hands_over_as_the_batch_fills():
    """A limit of the smallest param's size: every call carries what arrived since the last,
    at least one param, and together they carry each param once per step, in backward order
    (the head first)."""
    smallest = min(p.numel() for p in TinyLM().parameters() if p.requires_grad)
    for _, per_step, params in train(2, batch_elems=smallest, world=1):
        for calls in per_step:
            assert len(calls) > 1 and all(calls)
            handed = [pid for call in calls for pid in call]
            assert sorted(handed) == list(range(params))
            assert handed[0] == params - 1  # the head: registered last, its gradient first


def test_stage_3_releases_a_unit_as_its_last_gradient_is_queued():
    """Each unit is handed over and released as its last gradient is queued, before the
    next gradient is (as early as one call per gradient would, _handover.py), in fewer
    calls than params. The middle layer is the one sharded unit: after its gradients
    backward only reaches persistent units, which gather nothing (no gather's hand-over
    would release it)."""
    config = {"stage": 3, "optimizer": OPTIMIZER, "stage3": {"persistence_threshold": 200}}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(model, config, comm)
    core, queue = engine.engine, engine._queue
    events = []
    batched, release, add = core.accumulate_grads, core.release, queue.add

    def accumulate_grads(pids, *args):
        events.append(("call", list(pids)))
        return batched(pids, *args)

    def logged_release(unit):
        events.append(("release", unit))
        return release(unit)

    def logged_add(pid, *args):
        events.append(("queue", pid))
        return add(pid, *args)

    core.accumulate_grads, core.release, queue.add = accumulate_grads, logged_release, logged_add
    unit_of = {pid: engine._records[pid].unit for _, _, pid in engine._params}
    sharded = unit_of[engine._params[2][2]]  # the middle layer's
    assert set(unit_of.values()) - engine._units._persistent == {sharded}
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        del events[:]
        model(torch.randn(3, 4, generator=generator)).square().sum().backward()
        calls = [pids for kind, pids in events if kind == "call"]
        assert 1 < len(calls) < len(unit_of)
        assert sorted(pid for pids in calls for pid in pids) == sorted(unit_of)
        last = max(i for i, (kind, pid) in enumerate(events)
                   if kind == "queue" and unit_of[pid] == sharded)
        following = events[last + 1:]
        until_next = following[:next((j for j, (kind, _) in enumerate(following)
                                      if kind == "queue"), len(following))]
        assert ("release", sharded) in until_next, events
        engine.step()
    engine.close()
    comm.close()


def test_an_error_at_a_pass_end_leaves_the_next_backward_working():
    """A callback at the end of a backward pass that raises: the pass still ends (the
    gradients were handed over), the error reaches the caller, and the next micro-batch
    trains."""
    model = TinyLM()
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(model, {"stage": 2, "optimizer": OPTIMIZER}, comm)
    passes = engine._passes

    def broken():
        passes.on_end.remove(broken)
        raise RuntimeError("a broken end-of-pass callback")

    passes.on_end.append(broken)
    with pytest.raises(RuntimeError, match="broken end-of-pass"):
        loss_of(model, *batch(0)).backward()
    assert not passes.open and not passes.failed and len(engine._queue) == 0
    engine.step()
    loss_of(model, *batch(1)).backward()
    assert engine.step()["step"] == 2
    engine.close()
    comm.close()
