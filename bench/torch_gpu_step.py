#!/usr/bin/env python3
"""ZeroRT's engine as the optimizer of a PyTorch model on one GPU, against PyTorch's AdamW.

    python3 bench/torch_gpu_step.py [--steps 20] [--width 4096] [--layers 6] [--batch 64]
                                    [--leaf-blocks K]

On a lent GPU machine (no Debian packages there): `tools/gpu-check bundle` here, then
`tools/gpu-check torch-step` there with .gpu-bundle carried, which runs this with the
bundle's library on the loader's path.

One process, one GPU, one rank: what the engine's hand-over (a hook per param; at one rank
the engine reads autograd's gradient where it is, Engine::LendGrad), its reduction path and
its fused AdamW cost per step beside torch.optim.AdamW, on the same model and data.
Configurations:

    torch-fused    torch.optim.AdamW(fused=True)
    torch-foreach  torch.optim.AdamW(foreach=True)
    zerort-S       zerort.torch at stage S (0-3), an in-process communicator of one rank
    zerort-nccl-S  the same over NCCL (one rank), stages 0-3
    zerort-nccl-3/leafK  with `--leaf-blocks K`: stage 3 over NCCL, every K layers one leaf
                   module (zerort.torch.set_z3_leaf_modules): one unit per block, not per
                   Linear

Model: `layers` × (Linear(width, width) + Tanh) + Linear(width, 1), fp32 (100.7M params at
the defaults). Every configuration is built first, each with its own model, and the timed
steps are interleaved: round after round, one step of each configuration in turn (forward,
backward, optimizer step; CUDA synchronised before and after), so that a drift of the
machine's clocks reaches all of them alike, each round in its own (seeded) order, so that no
configuration always runs after the same one. Per configuration: the median step time over
`steps` rounds after 3 untimed ones; the median host time until the step's last call
returned (a step whose host time is near its step time is bound by the host's launches, not
by the GPU); the engine's host waits per timed step (EngineCounters.host_waits: each one
drains the GPU's queue; a steady step at stages 0-2 should have none) and gradient bytes it
copied per timed step (EngineCounters.grad_bytes_copied: none where it reads the gradients
where they are). Peak memory (PyTorch's allocator, and the engine's own allocations) comes
from a first pass that runs each configuration alone for 3 steps.
"""
import argparse
import gc
import random
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import zerort
import zerort.torch
from torch_vs_ddp import in_leaf_blocks


def build_model(width, layers):
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        modules += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*modules, nn.Linear(width, 1)).cuda()


class Config:
    """One configuration `name` of the benchmark: its model, optimizer or engine, and data."""

    def __init__(self, name, args):
        self.name = name
        self.model = build_model(args.width, args.layers)
        stage_name, _, leaf = name.partition("/leaf")
        if leaf:
            self.model = in_leaf_blocks(self.model, int(leaf))
        generator = torch.Generator(device="cuda").manual_seed(1)
        self.x = torch.randn(args.batch, args.width, device="cuda", generator=generator)
        self.y = self.x[:, :1].clone()
        self.comm = self.engine = self.optimizer = None
        if name.startswith("torch"):
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4,
                                               **{name.split("-")[1]: True})
            return
        comm = zerort.local_group(1)[0]
        if "nccl" in name:
            bootstrap, comm = comm, zerort.nccl_communicator(comm)
            bootstrap.close()
        self.comm = comm
        self.engine = zerort.torch.initialize(
            self.model, {"stage": int(stage_name[-1]), "optimizer": {"type": "adamw", "lr": 1e-4}},
            comm)

    def step(self):
        """One training step; returns (step ms, host ms until its last call returned)."""
        torch.cuda.synchronize()
        start = time.perf_counter()
        F.mse_loss(self.model(self.x), self.y).backward()
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.engine.step()
        returned = time.perf_counter()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3, (returned - start) * 1e3

    def counters(self):
        """(host waits, gradient bytes copied) so far; NaN without an engine."""
        if self.engine is None:
            return float("nan"), float("nan")
        counters = self.engine.engine.counters()
        return counters["host_waits"], counters["grad_bytes_copied"]

    def engine_mib(self):
        """The sum of the engine's per-category peak allocations, MiB."""
        if self.engine is None:
            return 0.0
        return sum(v[1] for v in self.engine.engine.memory_stats().values()) / 2**20

    def close(self):
        if self.engine is not None:
            self.engine.close()
            self.comm.close()


def peak_memory(name, args):
    """(PyTorch allocator's peak MiB, engine MiB) of `name` run alone for 3 steps."""
    gc.collect()  # the last configuration's model and engine, if a cycle still holds them
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    config = Config(name, args)
    for _ in range(3):
        config.step()
    engine_mib = config.engine_mib()
    config.close()
    del config
    return torch.cuda.max_memory_allocated() / 2**20, engine_mib


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--leaf-blocks", type=int, default=0)
    args = parser.parse_args()
    params = args.layers * (args.width * args.width + args.width) + args.width + 1
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{params / 1e6:.1f}M fp32 params, batch {args.batch}")
    names = ["torch-fused", "torch-foreach"] + [f"zerort-{s}" for s in range(4)]
    names += [f"zerort-nccl-{s}" for s in range(4)]
    if args.leaf_blocks:
        names.append(f"zerort-nccl-3/leaf{args.leaf_blocks}")
    memory = {}  # every configuration alone first, before any is kept for the timed rounds
    for name in names:
        try:
            memory[name] = peak_memory(name, args)
        except zerort.ZeroError as error:
            print(f"{name:<20} not run: {error}")
    configs = [Config(name, args) for name in names if name in memory]
    times = {config.name: [] for config in configs}
    order = random.Random(0)  # each round in its own order: no row always follows the same one
    for round_ in range(args.steps + 3):
        if round_ == 3:
            before = {config.name: config.counters() for config in configs}
        for config in order.sample(configs, len(configs)):
            measured = config.step()
            if round_ >= 3:
                times[config.name].append(measured)
    baseline = None
    print(f"{'config':<20} {'step ms':>8} {'vs fused':>9} {'host ms':>8} {'torch MiB':>10} "
          f"{'engine MiB':>11} {'waits/step':>11} {'copied MB/step':>15}")
    for config in configs:
        ms = statistics.median(t for t, _ in times[config.name])
        host_ms = statistics.median(h for _, h in times[config.name])
        waits, copied = (
            (after - first) / args.steps
            for after, first in zip(config.counters(), before[config.name]))
        torch_mib, engine_mib = memory[config.name]
        baseline = baseline or ms
        print(f"{config.name:<20} {ms:8.2f} {ms / baseline:9.2f} {host_ms:8.2f} "
              f"{torch_mib:10.0f} {engine_mib:11.0f} {waits:11.1f} {copied / 1e6:15.1f}")
    for config in configs:
        config.close()


if __name__ == "__main__":
    main()
