"""The model's whole state outside the engine: engine.module_state_dict() (DeepSpeed's
_zero3_consolidated_16bit_state_dict) and save_16bit_model() give what model.state_dict()
names (tied params under each name, persistent buffers) with full values, loadable into the
model built without an engine; and a checkpoint restores the module's buffers (BatchNorm's
running statistics), so a resumed run goes on as the uninterrupted one."""
import os
import pathlib
import subprocess

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zerort
import zerort.torch
from test_torch_engine import run_ranks

DIM, VOCAB, BATCH = 8, 11, 6
OPTIMIZER = {"type": "adamw", "lr": 0.01}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


class Tied(nn.Module):
    """A tied embedding and head, a BatchNorm (persistent running statistics), a persistent
    and a non-persistent buffer, a frozen projection, and extra state."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.norm = nn.BatchNorm1d(DIM)
        self.frozen = nn.Linear(DIM, DIM)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("position_ids", torch.arange(BATCH))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)

    def get_extra_state(self):  # as TransformerEngine's FP8 metadata
        return {"amax": 3.0}

    def set_extra_state(self, state):
        self.loaded_extra_state = state

    def forward(self, tokens):
        h = self.norm(self.embed(tokens) + 0.01 * self.position_ids[:tokens.shape[0], None])
        return self.head(torch.tanh(self.frozen(h)))


def batch(step, rank):
    generator = torch.Generator().manual_seed(10 * step + rank)
    return torch.randint(0, VOCAB, (BATCH,), generator=generator)


def train_steps(model, engine, steps, rank, first=0):
    for step in range(first, first + steps):
        tokens = batch(step, rank)
        engine.backward(F.cross_entropy(model(tokens), tokens))
        engine.step()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_module_state_dict_loads_into_the_model_built_without_an_engine(stage, tmp_path):
    models = [Tied() for _ in range(2)]
    config = {"stage": stage, "optimizer": OPTIMIZER, "stage3": {"persistence_threshold": 0},
              "guard": {"timeout_s": 30}}

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        train_steps(model, engine, 2, rank)
        state = engine.module_state_dict()
        assert engine.save_16bit_model(str(tmp_path), "model.bin") is True
        assert engine.save_fp16_model(str(tmp_path), "fp16.bin") is True  # the older name
        trainable = engine.state_dict()
        without_frozen = engine._zero3_consolidated_16bit_state_dict(
            exclude_frozen_parameters=True)
        engine.close()
        return state, trainable, without_frozen

    for rank, (state, trainable, without_frozen) in enumerate(run_ranks(2, body)):
        plain = Tied()
        assert list(state) == list(plain.state_dict())  # tied names, buffers, in its order
        assert state["head.weight"] is state["embed.weight"]
        assert torch.equal(state["embed.weight"], trainable["embed.weight"])
        assert state["norm.running_mean"].abs().sum() > 0  # trained statistics, this rank's
        assert "frozen.weight" not in without_frozen and "embed.weight" in without_frozen
        plain.load_state_dict(state)  # strict
        assert plain.loaded_extra_state == {"amax": 3.0}
        assert torch.equal(plain.head.weight, trainable["embed.weight"])
        if rank == 0:
            saved = torch.load(os.path.join(tmp_path, "model.bin"))
            older = torch.load(os.path.join(tmp_path, "fp16.bin"))
            assert list(older) == list(saved)
            assert all(torch.equal(older[name], saved[name]) for name in saved
                       if isinstance(saved[name], torch.Tensor))
            assert list(saved) == list(state)
            assert saved.pop("_extra_state") == state["_extra_state"]
            assert all(torch.equal(saved[name], state[name]) for name in saved)


class DetachingLinear(nn.Linear):
    """Writes its params detached whatever keep_vars says (as some libraries' overrides do);
    `transposed`: its weight transposed."""

    def __init__(self, transposed=False):
        super().__init__(DIM, 2)
        self.transposed = transposed

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        weight = self.weight.detach()
        destination[prefix + "weight"] = weight.t() if self.transposed else weight
        destination[prefix + "bias"] = self.bias.detach()


@pytest.mark.parametrize("transposed", [False, True])
def test_module_state_dict_of_an_override_that_detaches_gets_full_values(transposed):
    """At stage 3 an override's param.detach() views the param's placeholder between uses:
    module_state_dict() gives the full value in its place, and refuses an entry computed
    from it in another shape (it gave the placeholder's NaN)."""
    comm = zerort.local_group(1)[0]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, DIM), DetachingLinear(transposed))
    want = {name: value.clone() for name, value in model.state_dict().items()}
    engine = zerort.torch.initialize(
        model, {"stage": 3, "optimizer": OPTIMIZER, "stage3": {"persistence_threshold": 0}},
        comm)
    if transposed:
        with pytest.raises(zerort.FailedPreconditionError, match='"1.weight" is computed'):
            engine.module_state_dict()
    else:
        got = engine.module_state_dict()
        assert all(torch.equal(got[name], want[name]) for name in want)
    engine.close()
    comm.close()


@pytest.mark.parametrize("stage", [2, 3])
def test_a_checkpoint_restores_the_module_buffers(stage, tmp_path):
    """Two steps, a save, two more steps (the running statistics move on), a load: the
    buffers are rank 0's at the save, on every rank, and the next steps are those of the
    run that went on from the save."""
    models = [Tied() for _ in range(2)]
    config = {"stage": stage, "optimizer": OPTIMIZER, "stage3": {"persistence_threshold": 0},
              "guard": {"timeout_s": 30}}
    directory = str(tmp_path / "ckpt")

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        train_steps(model, engine, 2, rank)
        engine.save_checkpoint(directory)
        at_save = model.norm.running_mean.clone()
        train_steps(model, engine, 2, rank, first=2)
        went_on = engine.module_state_dict()
        assert not torch.equal(model.norm.running_mean, at_save)
        engine.load_checkpoint(directory)
        loaded = model.norm.running_mean.clone()
        train_steps(model, engine, 2, rank, first=2)
        resumed = engine.module_state_dict()
        engine.close()
        return at_save, loaded, went_on, resumed

    results = run_ranks(2, body)
    rank0_at_save = results[0][0]
    for _, loaded, went_on, resumed in results:
        assert torch.equal(loaded, rank0_at_save)
    # Rank 0 went on from its own statistics: its resumed run is the same one.
    _, _, went_on, resumed = results[0]
    for name in went_on:
        if name == "_extra_state":
            assert resumed[name] == went_on[name]
            continue
        assert torch.allclose(resumed[name], went_on[name], rtol=1e-5, atol=1e-6), name


def test_zero_ckpt_inspect_shows_odd_param_names_safely(tmp_path):
    """A param name with control bytes (an escape sequence) prints escaped, and one very long
    name does not pad every other row to its width."""
    tool = pathlib.Path(os.environ.get("ZERORT_LIBRARY", "")).parent.parent / "bin" / "zero-ckpt"
    if not tool.exists():
        pytest.skip(f"{tool} not built")
    model = nn.Module()
    model.register_parameter("red\x1b[31m", nn.Parameter(torch.ones(2)))
    model.register_parameter("x" * 200, nn.Parameter(torch.ones(3)))
    model.register_parameter("short", nn.Parameter(torch.ones(4)))

    def body(rank, comm):
        engine = zerort.torch.initialize(model, {"stage": 0, "optimizer": OPTIMIZER}, comm)
        engine.save_checkpoint(str(tmp_path / "ckpt"))
        engine.close()

    run_ranks(1, body)
    printed = subprocess.run([str(tool), "inspect", str(tmp_path / "ckpt")], check=True,
                             capture_output=True, text=True).stdout
    assert "\x1b" not in printed
    assert "red\\x1b[31m" in printed
    short_row = next(line for line in printed.splitlines() if "short" in line)
    assert len(short_row) < 100, short_row


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_ckpt_consolidate_writes_a_tied_param_under_every_name(stage, tmp_path):
    """The head tied to the embedding is one engine param; the checkpoint records its other
    name, and zero-ckpt consolidate writes it under both (as DeepSpeed's zero_to_fp32), so
    the file's params load into the model as its state dict names them."""
    tool = pathlib.Path(os.environ.get("ZERORT_LIBRARY", "")).parent.parent / "bin" / "zero-ckpt"
    if not tool.exists():
        pytest.skip(f"{tool} not built")
    from test_torch_stage3 import read_safetensors
    models = [Tied() for _ in range(2)]
    config = {"stage": stage, "optimizer": OPTIMIZER, "checkpoint": {"save_frozen": True},
              "guard": {"timeout_s": 30}}

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        train_steps(model, engine, 2, rank)
        engine.save_checkpoint(str(tmp_path / "ckpt"))
        state = engine.module_state_dict()
        engine.close()
        return state

    state = run_ranks(2, body)[0]
    out = tmp_path / "model.safetensors"
    printed = subprocess.run([str(tool), "consolidate", str(tmp_path / "ckpt"), "--out", str(out)],
                             check=True, capture_output=True, text=True).stdout
    assert "1 tied names" in printed
    consolidated = read_safetensors(out)
    plain = Tied()
    params = [name for name, _ in plain.named_parameters(prefix="")] + ["head.weight"]
    assert sorted(consolidated) == sorted(params)
    for name in params:
        assert torch.equal(consolidated[name], state[name].float()), name
    missing, unexpected = plain.load_state_dict(consolidated, strict=False)
    assert not unexpected and all("weight" not in name and "bias" not in name for name in missing)


def pretrained_state():
    """A state dict of Tied with other values than Tied() builds: params, running
    statistics, and the frozen projection."""
    model = Tied()
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.25 * torch.randn(param.shape, generator=generator))
        model.norm.running_mean.uniform_(-1, 1, generator=generator)
        model.norm.running_var.uniform_(0.5, 2, generator=generator)
    return model.state_dict()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_load_module_state_dict_loads_a_pretrained_model_into_the_engine(stage):
    """engine.load_module_state_dict(state_dict) on 3 ranks: every name (tied, frozen,
    buffers, extra state) holds the loaded values, and training goes on exactly as from a
    model built with them (the fp32 masters took them); DeepSpeed's {"module": ...} form;
    missing and unexpected keys as PyTorch's strict and non-strict load name them; at stage 3
    model.load_state_dict() names the way."""
    world, pretrained = 3, pretrained_state()
    config = {"stage": stage, "optimizer": OPTIMIZER, "stage3": {"persistence_threshold": 0},
              "guard": {"timeout_s": 30}}
    loaded_models = [Tied() for _ in range(world)]
    built_models = [Tied() for _ in range(world)]
    for model in built_models:
        model.load_state_dict(pretrained)

    def loaded(rank, comm):
        model = loaded_models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        keys = engine.load_module_state_dict({"module": pretrained} if rank else pretrained)
        assert keys.missing_keys == [] and keys.unexpected_keys == []
        state = engine.module_state_dict()
        assert model.loaded_extra_state == {"amax": 3.0}
        partial = {name: value for name, value in pretrained.items() if name != "norm.bias"}
        partial["extra.weight"] = torch.zeros(2)
        with pytest.raises(RuntimeError) as raised:
            engine.load_module_state_dict(partial)
        assert all(part in str(raised.value) for part in (
            'Unexpected key(s) in state_dict: "extra.weight"',
            'Missing key(s) in state_dict: "norm.bias"')), str(raised.value)
        keys = engine.load_module_state_dict(partial, strict=False)
        assert (keys.missing_keys, keys.unexpected_keys) == (["norm.bias"], ["extra.weight"])
        if stage == 3:
            with pytest.raises(zerort.FailedPreconditionError, match="load_module_state_dict"):
                model.load_state_dict(pretrained)
        train_steps(model, engine, 2, rank, first=1)
        result = engine.module_state_dict()
        engine.close()
        return state, result

    def built(rank, comm):
        model = built_models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        train_steps(model, engine, 2, rank, first=1)
        result = engine.module_state_dict()
        engine.close()
        return result

    reference = run_ranks(world, built)
    for rank, (state, result) in enumerate(run_ranks(world, loaded)):
        for name, value in pretrained.items():
            assert name == "_extra_state" or torch.equal(state[name], value), (rank, name)
        for name, value in reference[rank].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(result[name], value), (rank, name)
