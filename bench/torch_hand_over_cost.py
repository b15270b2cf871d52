#!/usr/bin/env python3
"""The Python time zerort.torch spends handing each gradient to the engine, per param.

    python3 bench/torch_hand_over_cost.py [--stages 0 2 3] [--steps 40] [--width 64]
                                          [--layers 100]

A model of many small params, `layers` × (Linear(width, width) + Tanh) + Linear(width, 1)
(2 × layers + 2 params), trained on one in-process rank with AdamW, one PyTorch thread and
one for ZeroRT's kernels. A timer wraps the two
methods every gradient goes through, TorchEngine._hand_over (the hook's checks and the queue,
_handover.py) and TorchEngine._flush_grads (the library call and what follows it), counted
once when one runs inside the other; over `steps` steps after 5 untimed ones it reports
their time per param per step, the library call included. A diagnostic of the hooks'
own cost: the step as a whole is timed by torch_step_overhead.py.
"""
import argparse
import os
import sys
import time

from torch_vs_ddp import ROOT, build_model, data


def measure(stage, steps, width, layers):
    """Microseconds per param per step inside the hand-over path at `stage`."""
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import zerort
    import zerort.torch
    from zerort.torch import _engine
    spent, depth = [0.0], [0]

    def timed(method):
        def wrapper(self, *args):
            depth[0] += 1
            start = time.perf_counter()
            try:
                return method(self, *args)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[0] += time.perf_counter() - start
        return wrapper

    originals = {name: getattr(_engine.TorchEngine, name)  # an older package: no queue
                 for name in ("_hand_over", "_flush_grads")
                 if hasattr(_engine.TorchEngine, name)}
    for name, method in originals.items():
        setattr(_engine.TorchEngine, name, timed(method))
    try:
        comm = zerort.local_group(1)[0]
        model = build_model(width, layers)
        engine = zerort.torch.initialize(
            model, {"stage": stage, "optimizer": {"type": "adamw", "lr": 1e-3}}, comm)
        params = sum(1 for _ in model.parameters())
        for step in range(5 + steps):
            if step == 5:
                spent[0] = 0.0
            x, y = data(step, 0, width)
            F.mse_loss(model(x), y).backward()
            engine.step()
        engine.close()
        comm.close()
    finally:
        for name, method in originals.items():
            setattr(_engine.TorchEngine, name, method)
    return 1e6 * spent[0] / steps / params


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 2, 3])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=100)
    args = parser.parse_args()
    os.environ.setdefault("ZERO_CPU_THREADS", "1")  # one thread for ZeroRT's kernels
    import torch
    torch.set_num_threads(1)
    print(f"model {args.layers} × Linear({args.width}, {args.width}) + Linear({args.width}, 1), "
          f"one in-process rank, {args.steps} timed steps")
    print("| stage | µs per param per step in the hand-over |")
    print("|---|---|")
    for stage in args.stages:
        cost = measure(stage, args.steps, args.width, args.layers)
        print(f"| {stage} | {cost:.2f} |", flush=True)


if __name__ == "__main__":
    main()
