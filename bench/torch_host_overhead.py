#!/usr/bin/env python3
"""zerort.torch's host time per step, on a model so small that host time is all there is.

    python3 bench/torch_host_overhead.py [--stages 0,2,3] [--width 64] [--layers 6]
                                         [--steps 300] [--persistence-threshold 0]
                                         [--device cpu] [--attribute] [--leaf-blocks K]

One process, one rank: `layers` × (Linear(width, width) + Tanh) + Linear(width, 1), batch 8.
Each round times a zerort.torch step (forward, backward, engine.step()) and forward +
backward alone of an identical plain model, interleaved; the medians' difference is what
the engine's hooks, library calls and optimizer step add per step. At stage 3 with
`--persistence-threshold 0` every module's params are a sharded unit, so the gathers and
releases of 7 units are in it. Host time is what bounds a GPU step of a model whose kernels
are short (bench/torch_gpu_step.py).

`--device cuda` runs both models on the GPU (the in-process communicator, one rank) and
times the host alone: the device's queue is drained before each timed part, not inside it.
`--attribute` also times each library call of core.Engine and each memory callback stage 3
makes into Python (its lend and give_back), and prints, per stage, their calls and µs per
step; what remains of the added time is the Python hooks and PyTorch's dispatch of them.
`--leaf-blocks K` groups every K consecutive (Linear, Tanh) layers into a block flagged as a
stage-3 leaf module (zerort.torch.set_z3_leaf_modules): one unit and one set of hooks per
block instead of per Linear.
"""
import argparse
import collections
import statistics
import time

import torch
import torch.nn.functional as F

import zerort
import zerort.core
import zerort.torch
from torch_vs_ddp import build_model, in_leaf_blocks

# The library calls a training step makes through core.Engine.
LIBRARY_CALLS = ("begin_iteration", "accumulate_grads", "gather", "release",
                 "release_until_backward", "end_backward", "step")


class CallTimes:
    """Wraps core.Engine's library calls and stage 3's memory callbacks with perf_counter
    while installed; `seconds[name]` lists each call's duration."""

    def __init__(self):
        self.seconds = collections.defaultdict(list)
        self._saved = {}

    def timed(self, name, function):
        """`function`, timed under `name`."""
        seconds = self.seconds[name]

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds.append(time.perf_counter() - start)
        return wrapper

    def install(self):
        engine = zerort.core.Engine
        for name in LIBRARY_CALLS + ("lend_gathered_memory",):
            self._saved[name] = getattr(engine, name)
        for name in LIBRARY_CALLS:
            setattr(engine, name, self.timed(name, self._saved[name]))
        lend_gathered_memory = self._saved["lend_gathered_memory"]

        def lending(core_engine, lend, give_back):
            if lend is not None:
                lend, give_back = self.timed("lend (callback)", lend), self.timed(
                    "give_back (callback)", give_back)
            return lend_gathered_memory(core_engine, lend, give_back)
        engine.lend_gathered_memory = lending

    def forget(self):
        """Drops the durations recorded so far."""
        for seconds in self.seconds.values():
            del seconds[:]

    def uninstall(self):
        for name, function in self._saved.items():
            setattr(zerort.core.Engine, name, function)


def overhead(stage, args, call_times=None):
    """(zerort.torch step µs, forward + backward alone µs) at `stage`, medians. With
    `call_times` (CallTimes), the timed steps' library calls are recorded there."""
    device = torch.device(args.device)
    model = build_model(args.width, args.layers).to(device)
    if args.leaf_blocks:
        model = in_leaf_blocks(model, args.leaf_blocks)
    plain = build_model(args.width, args.layers).to(device)
    x = torch.randn(8, args.width, device=device)
    y = x[:, :1].clone()
    comm = zerort.local_group(1)[0]
    if call_times is not None:
        call_times.install()
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
        if round_ == 20 and call_times is not None:
            call_times.forget()  # the untimed rounds' calls are not counted
        for step, times in zip((engine_step, plain_step), timed):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            step()
            if round_ >= 20:
                times.append((time.perf_counter() - start) * 1e6)
    if call_times is not None:
        call_times.uninstall()
    engine.close()
    comm.close()
    return statistics.median(timed[0]), statistics.median(timed[1])


def print_attribution(stage, call_times, steps):
    """Per library call and callback at `stage`: calls and µs per step."""
    parts = [f"{name} {len(seconds) / steps:g} × {sum(seconds) / steps * 1e6:.1f} µs"
             for name, seconds in call_times.seconds.items() if seconds]
    total = sum(sum(seconds) for seconds in call_times.seconds.values()) / steps * 1e6
    callbacks = sum(sum(seconds) for name, seconds in call_times.seconds.items()
                    if "callback" in name) / steps * 1e6
    print(f"stage {stage}, per step: library calls {total - callbacks:.0f} µs, of which "
          f"callbacks into Python {callbacks:.0f} µs: " + ", ".join(parts))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", default="0,2,3")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--persistence-threshold", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--attribute", action="store_true")
    parser.add_argument("--leaf-blocks", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {args.device}, {args.layers} × Linear({args.width}, "
          f"{args.width}) + Linear({args.width}, 1), stage3.persistence_threshold "
          f"{args.persistence_threshold}"
          + (f", leaf blocks of {args.leaf_blocks} layers" if args.leaf_blocks else ""))
    print("| stage | zerort.torch step µs | forward + backward µs | host time added µs |")
    print("|---|---|---|---|")
    attributions = []
    for stage in map(int, args.stages.split(",")):
        call_times = CallTimes() if args.attribute else None
        step_us, plain_us = overhead(stage, args, call_times)
        print(f"| {stage} | {step_us:.0f} | {plain_us:.0f} | {step_us - plain_us:.0f} |",
              flush=True)
        if call_times is not None:
            attributions.append((stage, call_times))
    for stage, call_times in attributions:
        print_attribution(stage, call_times, args.steps)


if __name__ == "__main__":
    main()
