#!/usr/bin/env python3
"""Stage 2 against stage 3 for a LoRA job through zerort.torch: memory per rank and step time.

    tests/mpi/run_mpi.sh N python3 bench/torch_lora_stage3.py [--layers 8] [--width 1024]
                                                              [--rank 8] [--steps 12]
                                                              [--prefetch_layers 2]

Model: `layers` × (a frozen Linear(width, width) plus a trainable rank-`rank` adapter, Tanh),
on a frozen input projection; fp32 on the CPU (98.4 % frozen at the defaults). Per stage
(2, then 3), on every rank: the engine's bytes (params, grads, optimizer, gathered units:
current after the last step and peak), the model's own param storages between steps, and the
median time of a step (forward, backward, engine.step()) over `steps` steps after 2 untimed
ones, every rank starting each step together. Stage 3 prefetches `prefetch_layers` base
weights ahead (stage3.prefetch_elems) and keeps a layer for its backward only when it comes
back within as many elements (stage3.max_reuse_elems; DeepSpeed's defaults, 5e7 and 1e9
elements, would hold this whole small model). Rank 0 prints a row per stage; the "vs stage 2"
column is the step-time ratio (the cost of sharding the frozen base: its gathers). DeepSpeed's
estimators for the same parameter count are printed beside (they count every param as
trained: 18 bytes each, sharded).
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import zerort
import zerort.torch


class LoraLayer(nn.Module):
    def __init__(self, width, rank):
        super().__init__()
        self.base = nn.Linear(width, width)
        self.base.requires_grad_(False)
        self.lora_a = nn.Linear(width, rank, bias=False)
        self.lora_b = nn.Linear(rank, width, bias=False)

    def forward(self, x):
        return torch.tanh(self.base(x) + self.lora_b(self.lora_a(x)))


def build_model(args):
    torch.manual_seed(0)
    projection = nn.Linear(args.width, args.width)
    projection.requires_grad_(False)
    layers = [LoraLayer(args.width, args.rank) for _ in range(args.layers)]
    return nn.Sequential(projection, *layers, nn.Linear(args.width, 1))


def storage_bytes(model):
    seen, total = set(), 0
    for param in model.parameters():
        storage = (param.untyped_storage() if hasattr(param, "untyped_storage")
                   else param.storage())
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def run(stage, args, comm):
    model = build_model(args)
    window = args.prefetch_layers * args.width * args.width
    config = {"stage": stage, "optimizer": {"type": "adamw", "lr": 1e-4},
              "stage3": {"prefetch_elems": window, "max_reuse_elems": window},
              "guard": {"timeout_s": 120}}
    engine = zerort.torch.initialize(model, config, comm)
    generator = torch.Generator().manual_seed(comm.rank)
    inputs = torch.randn(args.batch, args.width, generator=generator)
    targets = torch.randn(args.batch, 1, generator=generator)
    times = []
    for step in range(args.steps + 2):
        engine.all_reduce(torch.zeros(1))  # every rank starts the step together
        start = time.perf_counter()
        F.mse_loss(model(inputs), targets).backward()
        engine.step()
        if step >= 2:
            times.append(time.perf_counter() - start)
    memory = engine.memory_stats()
    held = storage_bytes(model)
    engine.close()
    return statistics.median(times), memory, held


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prefetch_layers", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = zerort.mpi_communicator()
    model = build_model(args)
    total = sum(p.numel() for p in model.parameters())
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    rows = {stage: run(stage, args, comm) for stage in (2, 3)}
    if comm.rank == 0:
        mb = 1e6
        print(f"LoRA job: {total / 1e6:.2f}M params, {100 * frozen / total:.1f} % frozen, "
              f"fp32, AdamW, {comm.size} rank(s); bytes per rank (rank 0), MB")
        print("stage  engine params  grads  optimizer  gathered (peak)  engine total (peak)"
              "  model storages  total held  step ms  vs stage 2")
        for stage, (seconds, memory, held) in rows.items():
            engine_now = sum(current for current, _ in memory.values())
            engine_peak = sum(peak for _, peak in memory.values())
            print(f"{stage:5d}  {memory['params'][0] / mb:13.2f}  {memory['grads'][0] / mb:5.2f}"
                  f"  {memory['optimizer'][0] / mb:9.2f}  {memory['gathered'][1] / mb:15.2f}"
                  f"  {engine_peak / mb:19.2f}  {held / mb:14.2f}"
                  f"  {(engine_now + held) / mb:10.2f}"
                  f"  {seconds * 1e3:7.2f}  {seconds / rows[2][0]:10.3f}")
        n = comm.size
        print(f"DeepSpeed's estimators for {total / 1e6:.2f}M params at {n} rank(s): ZeRO-2 "
              f"{(2 * total + 18 * total / n) / mb:.2f} MB, ZeRO-3 "
              f"{(4 * args.width * args.width + 18 * total / n) / mb:.2f} MB (every param "
              "counted as trained)")
    comm.close()


if __name__ == "__main__":
    main()
