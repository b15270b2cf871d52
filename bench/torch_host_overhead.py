#!/usr/bin/env python3
"""zerort.torch's host time per step on the CPU, where a tiny model makes it all there is.

    python3 bench/torch_host_overhead.py [--stages 0,2,3] [--width 64] [--layers 6]
                                         [--steps 300] [--persistence-threshold 0]

One process, one rank: `layers` × (Linear(width, width) + Tanh) + Linear(width, 1), batch 8.
Each round times a zerort.torch step (forward, backward, engine.step()) and forward +
backward alone of an identical plain model, interleaved; the medians' difference is what
the engine's hooks, library calls and optimizer step add per step. At stage 3 with
`--persistence-threshold 0` every module's params are a sharded unit, so the gathers and
releases of 7 units are in it. Host time is what bounds a GPU step of a model whose kernels
are short (bench/torch_gpu_step.py); here it is measured without a GPU.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import zerort
import zerort.torch
from torch_vs_ddp import build_model


def overhead(stage, args):
    """(zerort.torch step µs, forward + backward alone µs) at `stage`, medians."""
    model, plain = build_model(args.width, args.layers), build_model(args.width, args.layers)
    x = torch.randn(8, args.width)
    y = x[:, :1].clone()
    comm = zerort.local_group(1)[0]
    engine = zerort.torch.initialize(model, {
        "stage": stage, "optimizer": {"type": "adamw", "lr": 1e-4},
        "stage3": {"persistence_threshold": args.persistence_threshold}}, comm)

    def engine_step():
        F.mse_loss(model(x), y).backward()
        engine.step()

    def plain_step():
        F.mse_loss(plain(x), y).backward()
        plain.zero_grad(set_to_none=True)

    timed = ([], [])
    for round_ in range(args.steps + 20):
        for step, times in zip((engine_step, plain_step), timed):
            start = time.perf_counter()
            step()
            if round_ >= 20:
                times.append((time.perf_counter() - start) * 1e6)
    engine.close()
    comm.close()
    return statistics.median(timed[0]), statistics.median(timed[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", default="0,2,3")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--persistence-threshold", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {args.layers} × Linear({args.width}, {args.width}) + "
          f"Linear({args.width}, 1), stage3.persistence_threshold {args.persistence_threshold}")
    print("| stage | zerort.torch step µs | forward + backward µs | host time added µs |")
    print("|---|---|---|---|")
    for stage in map(int, args.stages.split(",")):
        step_us, plain_us = overhead(stage, args)
        print(f"| {stage} | {step_us:.0f} | {plain_us:.0f} | {step_us - plain_us:.0f} |")


if __name__ == "__main__":
    main()
