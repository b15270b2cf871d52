"""load_checkpoint(load_module_only=True), DeepSpeed's weights-only load: a run starts from
another run's weights (saved at another stage and world size) with its own fresh optimizer
state, exactly as if the model had been built with those weights; a checkpoint that does not
fit the model, or is damaged, is refused on every rank with nothing changed."""
import pytest
import torch
from torch import nn

import zerort
import zerort.torch
from test_torch_engine import run_ranks
from test_torch_module_state import OPTIMIZER, Tied, train_steps


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def config(stage):
    return {"stage": stage, "optimizer": OPTIMIZER, "checkpoint": {"save_frozen": True},
            "stage3": {"persistence_threshold": 0}, "guard": {"timeout_s": 30}}


def saved_run(root, stage=2, world=3, steps=2):
    """Trains Tied at `stage` on `world` ranks, saves into `root`; returns its full state."""
    models = [Tied() for _ in range(world)]

    def body(rank, comm):
        engine = zerort.torch.initialize(models[rank], config(stage), comm)
        train_steps(models[rank], engine, steps, rank)
        engine.save_checkpoint(str(root), client_state={"epoch": 7})
        state = engine.module_state_dict()
        engine.close()
        return state

    return run_ranks(world, body)[0]


def snapshot(model):
    return {n: t.detach().clone() for n, t in model.state_dict().items() if n != "_extra_state"}


@pytest.mark.parametrize("stage", [0, 3])
def test_a_run_starts_from_saved_weights_with_a_fresh_optimizer(stage, tmp_path):
    saved = saved_run(tmp_path)
    world = 2
    models = [Tied() for _ in range(2 * world)]  # built here: the seed is global to threads

    def loaded(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config(stage), comm)
        path, client_state = engine.load_checkpoint(str(tmp_path), load_module_only=True)
        assert path.endswith("global_step2") and client_state == {"epoch": 7}
        assert engine.global_steps == 0  # this run's counters stay its own
        after_load = engine.module_state_dict()
        train_steps(model, engine, 2, rank, first=5)
        state = engine.module_state_dict()
        engine.close()
        return after_load, state

    def built_with_them(rank, comm):
        model = models[world + rank]
        model.load_state_dict({**saved, "_extra_state": saved["_extra_state"]})
        engine = zerort.torch.initialize(model, config(stage), comm)
        train_steps(model, engine, 2, rank, first=5)
        state = engine.module_state_dict()
        engine.close()
        return state

    want = run_ranks(world, built_with_them)
    for rank, (after_load, state) in enumerate(run_ranks(world, loaded)):
        for name, value in saved.items():
            if name != "_extra_state":
                assert torch.equal(after_load[name], value), name
        for name, value in want[rank].items():
            if name != "_extra_state":
                assert torch.equal(state[name], value), (rank, name)


class Wider(Tied):
    """Tied with one more trainable param, which no checkpoint of Tied holds."""

    def __init__(self):
        super().__init__()
        self.extra = nn.Parameter(torch.ones(3))

    def forward(self, tokens):
        return super().forward(tokens) * self.extra.sum() / 3


def test_a_checkpoint_that_does_not_fit_or_is_damaged_changes_nothing(tmp_path):
    saved_run(tmp_path, world=2, steps=1)
    wider = [Wider() for _ in range(2)]

    def body(rank, comm):
        model = wider[rank]
        engine = zerort.torch.initialize(model, config(2), comm)
        before = snapshot(model)
        with pytest.raises(zerort.InvalidArgumentError,
                           match="extra is not in it.*load_module_strict=False"):
            engine.load_checkpoint(str(tmp_path), load_module_only=True)
        assert all(torch.equal(model.state_dict()[n], v) for n, v in before.items())
        with pytest.raises(zerort.UnimplementedError, match="load_lr_scheduler_states=False"):
            engine.load_checkpoint(str(tmp_path), load_optimizer_states=False)
        engine.load_checkpoint(str(tmp_path), load_module_only=True, load_module_strict=False)
        loaded = snapshot(model)
        assert torch.equal(loaded["extra"], before["extra"])
        assert not torch.equal(loaded["embed.weight"], before["embed.weight"])
        train_steps(model, engine, 1, rank)  # then it trains
        engine.backward(model(torch.zeros(6, dtype=torch.long)).sum())
        with pytest.raises(zerort.FailedPreconditionError, match="accumulation boundary"):
            engine.load_checkpoint(str(tmp_path), load_module_only=True,
                                   load_module_strict=False)
        engine.step()
        engine.close()

    run_ranks(2, body)

    rank_file = tmp_path / "global_step1" / "rank-1-of-2.bin"
    data = bytearray(rank_file.read_bytes())
    data[len(data) // 2] ^= 0x5A
    rank_file.write_bytes(bytes(data))

    plain = [Tied() for _ in range(3)]

    def damaged(rank, comm):
        model = plain[rank]
        engine = zerort.torch.initialize(model, config(3), comm)
        before = engine.module_state_dict()
        with pytest.raises(zerort.DataLossError, match="rank-1-of-2"):  # rank 0's, everywhere
            engine.load_checkpoint(str(tmp_path), load_module_only=True)
        after = engine.module_state_dict()
        assert all(torch.equal(after[n], v) for n, v in before.items() if n != "_extra_state")
        engine.close()

    run_ranks(3, damaged)
