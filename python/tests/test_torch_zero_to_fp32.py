"""The model's fp32 state dict from a checkpoint, in one process with no engine and no ranks
(DeepSpeed's zero_to_fp32: get_fp32_state_dict_from_zero_checkpoint,
convert_zero_checkpoint_to_fp32_state_dict, load_state_dict_from_zero_checkpoint and the
command line, under zerort.torch.deepspeed.utils.zero_to_fp32): each trainable param's fp32
master exactly as the engine held it at the save, tied names sharing one tensor, frozen params
and module buffers, from checkpoints of 3 in-process ranks at stages 0, 2 and 3."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

import zerort
import zerort.torch
from test_torch_engine import run_ranks
from test_torch_module_state import OPTIMIZER, Tied, train_steps
from zerort.torch.deepspeed.utils.zero_to_fp32 import (
    convert_zero_checkpoint_to_fp32_state_dict, get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint)

WORLD = 3


class Tied16(Tied):
    """Tied whose position term takes the embedding's dtype (a bf16 model's BatchNorm then
    sees one dtype)."""

    def forward(self, tokens):
        h = self.embed(tokens)
        h = self.norm(h + (0.01 * self.position_ids[:tokens.shape[0], None]).to(h.dtype))
        return self.head(torch.tanh(self.frozen(h)))


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def train_and_save(root, stage, precision="fp32", save_frozen=True, steps=2, world=WORLD,
                   keep_open=None):
    """Trains Tied on `world` ranks and saves into `root` after each step (tags step1, ...);
    returns rank 0's view at the last save: the trainable params' fp32 masters and the module
    state dict (frozen values, buffers). `keep_open(model)`, if given, runs on rank 0 while its
    engine is still open."""
    models = [(Tied16 if precision != "fp32" else Tied)() for _ in range(world)]
    config = {"stage": stage, "optimizer": OPTIMIZER, "precision": {"param": precision},
              "checkpoint": {"save_frozen": save_frozen}, "stage3": {"persistence_threshold": 0},
              "guard": {"timeout_s": 30}}

    def body(rank, comm):
        model = models[rank]
        engine = zerort.torch.initialize(model, config, comm)
        for step in range(steps):
            train_steps(model, engine, 1, rank, first=step)
            engine.save_checkpoint(str(root), tag=f"step{step + 1}")
        masters = {name: zerort.torch.safe_get_full_fp32_param(param)
                   for name, param in model.named_parameters() if param.requires_grad}
        state = engine.module_state_dict()
        if keep_open is not None and rank == 0:
            keep_open(model)
        engine.close()
        return masters, state

    return run_ranks(world, body)[0]


@pytest.mark.parametrize("stage,precision", [(0, "fp32"), (2, "fp32"), (3, "fp32"),
                                             (3, "bf16")])
def test_the_state_dict_holds_the_masters_tied_names_frozen_params_and_buffers(
        stage, precision, tmp_path):
    masters, state = train_and_save(tmp_path, stage, precision)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is missing: no warning
        read = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path))  # `latest`: step2
    plain = Tied()
    expected = [name for name in plain.state_dict() if name != "_extra_state"]
    assert sorted(read) == sorted(expected)
    assert read["head.weight"] is read["embed.weight"]
    for name, master in masters.items():
        assert read[name].dtype == torch.float32
        assert torch.equal(read[name], master), name
    assert torch.equal(read["frozen.weight"].to(state["frozen.weight"].dtype),
                       state["frozen.weight"])
    for name in ("norm.running_mean", "norm.running_var", "norm.num_batches_tracked",
                 "position_ids"):
        assert torch.equal(read[name], state[name]), name
    assert read["norm.num_batches_tracked"].item() == 2
    if precision == "fp32":  # the model's values are the masters: a strict load of them
        missing, unexpected = plain.load_state_dict(read, strict=False)
        assert missing == ["_extra_state"] and not unexpected
        for name, value in state.items():
            if name != "_extra_state":
                assert torch.equal(plain.state_dict()[name], value), name


def test_a_tag_reads_an_earlier_checkpoint_and_the_file_and_command_line_hold_the_same(
        tmp_path):
    root = tmp_path / "checkpoints"
    masters, _ = train_and_save(root, stage=2, steps=2)
    latest = get_fp32_state_dict_from_zero_checkpoint(root)
    first = get_fp32_state_dict_from_zero_checkpoint(root, tag="step1")
    assert torch.equal(latest["embed.weight"], masters["embed.weight"])
    assert not torch.equal(first["embed.weight"], latest["embed.weight"])
    assert torch.equal(get_fp32_state_dict_from_zero_checkpoint(root / "step1")["embed.weight"],
                       first["embed.weight"])

    written = convert_zero_checkpoint_to_fp32_state_dict(root, tmp_path)  # a directory
    assert written == os.path.join(tmp_path, "pytorch_model.bin")
    saved = torch.load(written)
    assert sorted(saved) == sorted(latest)
    assert saved["head.weight"] is saved["embed.weight"]
    assert all(torch.equal(saved[name], latest[name]) for name in latest)

    made = convert_zero_checkpoint_to_fp32_state_dict(root, output_dir=tmp_path / "new")
    assert made == os.path.join(tmp_path / "new", "pytorch_model.bin")  # newer DeepSpeed's
    assert sorted(torch.load(made)) == sorted(latest)
    out = tmp_path / "first.bin"
    done = subprocess.run([sys.executable, "-m", "zerort.torch.deepspeed.utils.zero_to_fp32",
                           str(root), str(out), "-t", "step1"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout
    assert torch.equal(torch.load(out)["embed.weight"], first["embed.weight"])

    with pytest.raises(zerort.InvalidArgumentError, match="inside the checkpoint"):
        convert_zero_checkpoint_to_fp32_state_dict(root, root / "step2" / "model.bin")
    assert not (root / "step2" / "model.bin").exists()
    with pytest.raises(zerort.UnimplementedError, match="zero-ckpt consolidate"):
        convert_zero_checkpoint_to_fp32_state_dict(root, out, safe_serialization=True)
    with pytest.raises(zerort.UnimplementedError, match="lazy_mode"):
        get_fp32_state_dict_from_zero_checkpoint(root, lazy_mode=True)


def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path):
    train_and_save(tmp_path, stage=3, steps=1, world=2)
    rank_file = tmp_path / "step1" / "rank-1-of-2.bin"
    data = bytearray(rank_file.read_bytes())
    data[len(data) // 2] ^= 0x5A
    rank_file.write_bytes(bytes(data))
    with pytest.raises(zerort.DataLossError, match="rank-1-of-2"):
        get_fp32_state_dict_from_zero_checkpoint(tmp_path)
    done = subprocess.run([sys.executable, "-m", "zerort.torch.deepspeed.utils.zero_to_fp32",
                           str(tmp_path), str(tmp_path / "model.bin")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "rank-1-of-2" in done.stderr, done.stderr
    assert not (tmp_path / "model.bin").exists()
    with pytest.raises(zerort.NotFoundError, match="absent"):
        get_fp32_state_dict_from_zero_checkpoint(tmp_path / "absent")


def test_frozen_params_left_out_of_the_checkpoint_are_named_and_the_model_keeps_them(tmp_path):
    refused = []

    def load_while_open(model):
        with pytest.raises(zerort.FailedPreconditionError, match="engine.load_checkpoint"):
            load_state_dict_from_zero_checkpoint(model, tmp_path)
        refused.append(True)

    masters, _ = train_and_save(tmp_path, stage=2, save_frozen=False, steps=1, world=2,
                                keep_open=load_while_open)
    assert refused == [True]
    with pytest.warns(UserWarning,
                      match=r"2 frozen params \(frozen.weight, frozen.bias\).*save_frozen"):
        read = get_fp32_state_dict_from_zero_checkpoint(tmp_path)
    assert "frozen.weight" not in read and "embed.weight" in read
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainable = get_fp32_state_dict_from_zero_checkpoint(tmp_path,
                                                             exclude_frozen_parameters=True)
    assert sorted(trainable) == sorted(read)

    fresh = Tied()
    with torch.no_grad():
        fresh.frozen.weight.mul_(3.0)  # the model's own frozen values stay
    kept = fresh.frozen.weight.clone()
    with pytest.warns(UserWarning, match="frozen params"):
        loaded = load_state_dict_from_zero_checkpoint(fresh, tmp_path)
    assert loaded is fresh
    assert torch.equal(fresh.frozen.weight, kept)
    assert torch.equal(fresh.embed.weight, masters["embed.weight"])
    assert fresh.head.weight is fresh.embed.weight


class WithEmpty(Tied):
    """Tied with a trainable param of no elements (never in a checkpoint's records)."""

    def __init__(self):
        super().__init__()
        self.nothing = torch.nn.Parameter(torch.zeros(0, 4))
        self.frozen_nothing = torch.nn.Parameter(torch.zeros(0), requires_grad=False)


def test_a_param_without_elements_is_in_the_state_dict(tmp_path):
    models = [WithEmpty() for _ in range(2)]

    def body(rank, comm):
        engine = zerort.torch.initialize(models[rank], {"stage": 2, "optimizer": OPTIMIZER},
                                         comm)
        train_steps(models[rank], engine, 1, rank)
        engine.save_checkpoint(str(tmp_path))
        engine.close()

    run_ranks(2, body)
    with pytest.warns(UserWarning, match="frozen params"):
        state = get_fp32_state_dict_from_zero_checkpoint(tmp_path)
    assert state["nothing"].shape == (0, 4) and state["frozen_nothing"].shape == (0,)
    trainable = get_fp32_state_dict_from_zero_checkpoint(tmp_path, exclude_frozen_parameters=True)
    assert "nothing" in trainable and "frozen_nothing" not in trainable
    missing, unexpected = WithEmpty().load_state_dict(state, strict=False)
    assert not unexpected and all(name.startswith(("frozen.", "_extra")) for name in missing)
