#!/usr/bin/env python3
"""ZeroRT's engine as the optimizer of a PyTorch model on one GPU, against PyTorch's AdamW.

    python3 bench/torch_gpu_step.py [--steps 20] [--width 4096] [--layers 6] [--batch 64]

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

Model: `layers` × (Linear(width, width) + Tanh) + Linear(width, 1), fp32 (100.7M params at
the defaults). Per configuration: median step time (forward, backward, optimizer step;
CUDA synchronised) over `steps` steps after 3 untimed ones, and the peak GPU memory PyTorch's
allocator held plus, for ZeroRT, the engine's peak bytes (its own allocations), and the
engine's host waits per timed step (EngineCounters.host_waits: each one drains the GPU's
queue; a steady step at stages 0-2 should have none) and gradient bytes it copied per timed
step (EngineCounters.grad_bytes_copied: none where it reads the gradients where they are).
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import zerort
import zerort.torch


def build_model(width, layers):
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        modules += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*modules, nn.Linear(width, 1)).cuda()


def measure(name, args):
    """Median step time (ms) and peak memory (MiB) of configuration `name`."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = build_model(args.width, args.layers)
    generator = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(args.batch, args.width, device="cuda", generator=generator)
    y = x[:, :1].clone()
    comm = engine = optimizer = None
    if name.startswith("torch"):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                      **{name.split("-")[1]: True})
    else:
        stage = int(name[-1])
        comm = zerort.local_group(1)[0]
        if "nccl" in name:
            bootstrap, comm = comm, zerort.nccl_communicator(comm)
            bootstrap.close()
        engine = zerort.torch.initialize(
            model, {"stage": stage, "optimizer": {"type": "adamw", "lr": 1e-4}}, comm)
    times = []
    before = {}
    for step in range(args.steps + 3):
        if step == 3 and engine is not None:
            before = engine.engine.counters()
        torch.cuda.synchronize()
        start = time.perf_counter()
        F.mse_loss(model(x), y).backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            engine.step()
        torch.cuda.synchronize()
        if step >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    engine_mib = 0.0
    waits = copied_mb = float("nan")
    if engine is not None:
        after = engine.engine.counters()
        waits = (after["host_waits"] - before["host_waits"]) / args.steps
        copied_mb = (after["grad_bytes_copied"] - before["grad_bytes_copied"]) / args.steps / 1e6
        engine_mib = sum(v[1] for v in engine.engine.memory_stats().values()) / 2**20
        engine.close()
        comm.close()
    torch_mib = torch.cuda.max_memory_allocated() / 2**20
    del model, optimizer, engine
    return statistics.median(times), torch_mib, engine_mib, waits, copied_mb


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    params = args.layers * (args.width * args.width + args.width) + args.width + 1
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{params / 1e6:.1f}M fp32 params, batch {args.batch}")
    names = ["torch-fused", "torch-foreach"] + [f"zerort-{s}" for s in range(4)]
    names += [f"zerort-nccl-{s}" for s in range(4)]
    baseline = None
    print(f"{'config':<14} {'step ms':>8} {'vs fused':>9} {'torch MiB':>10} {'engine MiB':>11} "
          f"{'waits/step':>11} {'copied MB/step':>15}")
    for name in names:
        try:
            ms, torch_mib, engine_mib, waits, copied_mb = measure(name, args)
        except zerort.ZeroError as error:
            print(f"{name:<14} not run: {error}")
            continue
        baseline = baseline or ms
        print(f"{name:<14} {ms:8.2f} {ms / baseline:9.2f} {torch_mib:10.0f} {engine_mib:11.0f} "
              f"{waits:11.1f} {copied_mb:15.1f}")


if __name__ == "__main__":
    main()
