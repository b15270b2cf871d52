#!/usr/bin/env python3
"""What a training step costs beyond forward + backward, timed interleaved in one process.

    python3 bench/torch_step_overhead.py [--ranks 2] [--steps 20] [--width 1024] [--layers 6]
                                         [--modes ddp zerort-0 ...] [--lend-gradients]

Each configuration runs in fresh processes under mpirun (tests/mpi/run_mpi.sh). Every
process holds two identical models (same architecture, same initial values): the one
trained by the configuration, and a plain one that only runs forward + backward. Each step
times, in turn, forward + backward of the plain model and a whole training step of the
other (forward, backward, gradient reduction, optimizer step), every timed part starting on
all ranks together (an MPI barrier before it), so both see the same machine state. The
median over steps of the ratio of the two (each step's pair measured back to back, in
alternating order) is what the data parallelism and the optimizer cost on top of the model's
own work. Per step, the ratio is that of the slowest rank's training step to the slowest
rank's forward + backward (each part ends for the job when its last rank is done; a rank
that computes faster than its peer would otherwise be charged its wait in the step's
collectives); "per rank" is the median of each rank's own ratio, the larger rank's:

    ddp       DistributedDataParallel (gloo) + torch.optim.AdamW
    zerort-S  zerort.torch at stage S (0-3), MPI communicator

Model: `layers` × (Linear(width, width) + Tanh) + Linear(width, 1), fp32, batch 64 per rank,
one PyTorch thread per rank and one for ZeroRT's kernels. Per configuration, over `steps`
steps after 3 untimed ones: the medians of each part (the slower rank's) and of the ratios,
the minor page faults per training step (the larger rank's mean: fresh memory the step
touched), and ZeroRT's counters per step. `--lend-gradients` sets zerort.torch's
engine.lend_gradients (the GPU's default; a rank alone then copies no gradient).
"""
import argparse
import os
import resource
import statistics
import sys
import time

from torch_vs_ddp import BATCH, ROOT, build_model, data, run_configuration, write_report

MODES = ["ddp", "zerort-0", "zerort-1", "zerort-2", "zerort-3"]


def run_rank(mode, steps, width, layers, lend_gradients=False):
    """One rank of one configuration; returns its medians (ms) and counters."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import zerort
    import zerort.torch
    torch.set_num_threads(1)
    comm = zerort.mpi_communicator()
    rank, world = comm.rank, comm.size
    plain = build_model(width, layers)
    trained = build_model(width, layers)
    token = torch.zeros(1)
    engine = None
    if mode == "ddp":
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        trained = torch.nn.parallel.DistributedDataParallel(trained)
        optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-3)

        def step_once(x, y):
            optimizer.zero_grad(set_to_none=True)
            F.mse_loss(trained(x), y).backward()
            optimizer.step()
    else:
        engine = zerort.torch.initialize(
            trained, {"stage": int(mode.split("-")[1]),
                      "optimizer": {"type": "adamw", "lr": 1e-3}}, comm)
        engine.lend_gradients = lend_gradients

        def step_once(x, y):
            F.mse_loss(trained(x), y).backward()
            engine.step()

    def forward_backward(x, y):
        for param in plain.parameters():
            param.grad = None
        F.mse_loss(plain(x), y).backward()

    def timed(part, x, y):
        """The part's seconds and minor page faults."""
        comm.all_reduce_f32(token.data_ptr(), 1)  # every rank starts the part together
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        part(x, y)
        elapsed = time.perf_counter() - start
        return elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    alone, whole, step_faults = [], [], []
    counted = None
    for step in range(3 + steps):
        if step == 3 and engine is not None:
            counted = dict(engine.counters())
        x, y = data(step, rank, width)
        first, second = (forward_backward, step_once) if step % 2 == 0 else (
            step_once, forward_backward)
        times = {first: timed(first, x, y), second: timed(second, x, y)}
        if step >= 3:
            alone.append(times[forward_backward][0])
            whole.append(times[step_once][0])
            step_faults.append(times[step_once][1])
    per_step = None
    if engine is not None:
        now = engine.counters()
        per_step = {k: (now[k] - counted[k]) / steps for k in now}
        engine.close()
    comm.close()
    return {"rank": rank, "alone_ms": 1e3 * statistics.median(alone),
            "step_ms": 1e3 * statistics.median(whole),
            "alone_s": alone, "step_s": whole,
            "ratio": statistics.median(w / a for w, a in zip(whole, alone)),
            "faults": statistics.mean(step_faults),
            "counters": per_step,
            "params": sum(p.numel() for p in plain.parameters())}


def drive(args):
    print(f"{args.ranks} ranks, {args.steps} timed steps, model {args.layers} × "
          f"Linear({args.width}, {args.width}) + Linear({args.width}, 1), batch {BATCH} per rank")
    print("| config | forward + backward ms | step ms | step / (forward + backward), per step "
          "| the same, per rank | minor faults per step |")
    print("|---|---|---|---|---|---|")
    counters = {}
    for mode in args.modes:
        extra = ["--lend-gradients"] if args.lend_gradients else []
        reports = run_configuration(__file__, mode, args.ranks,
                                    ["--steps", str(args.steps), "--width", str(args.width),
                                     "--layers", str(args.layers)] + extra)
        if reports is None:
            continue
        alone = max(r["alone_ms"] for r in reports)
        step = max(r["step_ms"] for r in reports)
        per_rank = max(r["ratio"] for r in reports)
        # The job's ratio: each step's slowest rank against each forward + backward's
        # slowest rank (both parts end when the last rank is done).
        ratio = statistics.median(
            max(r["step_s"][i] for r in reports) / max(r["alone_s"][i] for r in reports)
            for i in range(args.steps))
        faults = max(r["faults"] for r in reports)
        print(f"| {mode} | {alone:.1f} | {step:.1f} | {ratio:.3f} | {per_rank:.3f} "
              f"| {faults:.0f} |", flush=True)
        if reports[0]["counters"] is not None:
            counters[mode] = reports[0]["counters"]
    for mode, values in counters.items():
        shown = ", ".join(f"{k} {v:g}" for k, v in values.items() if v)
        print(f"{mode} per step (rank 0): {shown}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=MODES)
    parser.add_argument("--lend-gradients", action="store_true")
    parser.add_argument("--rank-mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_mode:
        write_report(args.out, run_rank(args.rank_mode, args.steps, args.width, args.layers,
                                        args.lend_gradients))
    else:
        drive(args)


if __name__ == "__main__":
    main()
