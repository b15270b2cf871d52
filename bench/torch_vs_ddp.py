#!/usr/bin/env python3
"""PyTorch's own data parallelism against ZeroRT, on the same model, ranks and data.

    python3 bench/torch_vs_ddp.py [--ranks 2] [--steps 10] [--width 1024] [--layers 6]

runs each configuration in fresh processes under mpirun (tests/mpi/run_mpi.sh), so each
peak RSS is that configuration's own, and prints one table:

    ddp       DistributedDataParallel (gloo) + torch.optim.AdamW (foreach where available)
    zero1     DistributedDataParallel + ZeroRedundancyOptimizer(AdamW): ZeRO-1
    zerort-S  zerort.torch at stage S (0-3), MPI communicator

Model: `layers` × (Linear(width, width) + Tanh) + Linear(width, 1) (6.3M fp32 params by
default; --width 4096 gives 100.7M), batch 64 per rank, one PyTorch thread per rank (and one
for ZeroRT's kernels). Per configuration: median step time over `steps` timed steps after 3
untimed ones (forward, backward, optimizer step; the slowest rank's median), peak RSS per rank
(the largest) and the peak RSS once the model was built (before DDP or ZeroRT took it), and for
ZeroRT the engine's peak bytes per category.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BATCH = 64
MODES = ["ddp", "zero1", "zerort-0", "zerort-1", "zerort-2", "zerort-3"]


def build_model(width, layers):
    import torch
    from torch import nn
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        modules += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*modules, nn.Linear(width, 1))


def in_leaf_blocks(model, layers_per_block):
    """`model` (build_model's) with every `layers_per_block` (Linear, Tanh) layers in one
    nn.Sequential block flagged as a stage-3 leaf module (zerort.torch.set_z3_leaf_modules):
    the same params in the same order, one unit and one set of hooks per block."""
    from torch import nn
    import zerort.torch
    *layers, head = list(model)
    step = 2 * layers_per_block
    blocks = [nn.Sequential(*layers[i:i + step]) for i in range(0, len(layers), step)]
    model = nn.Sequential(*blocks, head)
    zerort.torch.set_z3_leaf_modules_by_name(model, [str(i) for i in range(len(blocks))])
    return model


def data(step, rank, width):
    import torch
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(BATCH, width, generator=generator)
    return x, x[:, :1].clone()


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_rank(mode, steps, width, layers):
    """One rank of one configuration; returns its measurements."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    model = build_model(width, layers)
    built_rss_mb = peak_rss_mb()
    params = sum(p.numel() for p in model.parameters())
    memory = None
    if mode in ("ddp", "zero1"):
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model)
        if mode == "ddp":
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            optimizer = ZeroRedundancyOptimizer(model.parameters(),
                                                optimizer_class=torch.optim.AdamW, lr=1e-3)

        def step_once(step):
            x, y = data(step, rank, width)
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
    else:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import zerort
        import zerort.torch
        engine = zerort.torch.initialize(
            model, {"stage": int(mode.split("-")[1]),
                    "optimizer": {"type": "adamw", "lr": 1e-3}},
            zerort.mpi_communicator())

        def step_once(step):
            x, y = data(step, rank, width)
            F.mse_loss(model(x), y).backward()
            engine.step()
    times = []
    for step in range(3 + steps):
        start = time.perf_counter()
        step_once(step)
        if step >= 3:
            times.append(time.perf_counter() - start)
    if mode.startswith("zerort"):
        memory = {k: v[1] for k, v in engine.engine.memory_stats().items()}
        engine.close()
    return {"rank": rank, "step_ms": 1e3 * statistics.median(times),
            "peak_rss_mb": peak_rss_mb(), "built_rss_mb": built_rss_mb,
            "params": params,
            "zerort_peak_bytes": memory}


def run_configuration(script, mode, ranks, arguments):
    """Runs `script` --rank-mode `mode` `arguments` on `ranks` fresh processes under
    mpirun; returns each rank's report (the JSON it wrote into --out), or None after
    printing why it failed."""
    out = tempfile.mkdtemp(prefix="zerort-bench-")
    command = [os.path.join(ROOT, "tests", "mpi", "run_mpi.sh"), str(ranks),
               sys.executable, os.path.abspath(script), "--rank-mode", mode,
               *arguments, "--out", out]
    # ZeroRT as a user runs it: the measured reduce-scatter and all-reduce choices
    # (run_mpi.sh would force the ring and the direct all-reduce), and one thread for its
    # kernels, like PyTorch here.
    env = dict(os.environ, ZERO_MPI_REDUCE_SCATTER="auto", ZERO_MPI_ALL_REDUCE="auto",
               ZERO_CPU_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    reports = []
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name), encoding="utf-8") as file:
            reports.append(json.load(file))
    if result.returncode != 0 or len(reports) != ranks:
        print(f"{mode}: failed (exit {result.returncode})\n{result.stderr[-2000:]}")
        return None
    return reports


def write_report(out, report):
    """A rank's report into directory `out`, for run_configuration."""
    with open(os.path.join(out, f"rank-{report['rank']}.json"), "w", encoding="utf-8") as file:
        json.dump(report, file)


def drive(ranks, steps, width, layers):
    rows, params = [], 0
    for mode in MODES:
        reports = run_configuration(__file__, mode, ranks,
                                    ["--steps", str(steps), "--width", str(width),
                                     "--layers", str(layers)])
        if reports is None:
            continue
        rows.append((mode, max(r["step_ms"] for r in reports),
                     max(r["peak_rss_mb"] for r in reports),
                     max(r["built_rss_mb"] for r in reports), reports[0]["zerort_peak_bytes"]))
        params = reports[0]["params"]
    ddp_ms = next((row[1] for row in rows if row[0] == "ddp"), None)
    print(f"{ranks} ranks, {steps} timed steps, {params / 1e6:.1f}M fp32 params "
          f"({layers} × {width}), batch {BATCH} per rank")
    print("| config | step ms | vs DDP | peak RSS MiB/rank | peak RSS once built | "
          "ZeroRT peak MiB: params, grads, optimizer, comm, gathered |")
    print("|---|---|---|---|---|---|")
    for mode, ms, rss, built, memory in rows:
        ratio = f"{ms / ddp_ms:.2f}" if ddp_ms else "-"
        categories = ("params", "grads", "optimizer", "comm", "gathered")
        engine = ("-" if memory is None
                  else ", ".join(f"{memory[k] / 2**20:.1f}" for k in categories))
        print(f"| {mode} | {ms:.1f} | {ratio} | {rss:.0f} | {built:.0f} | {engine} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--rank-mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_mode:
        write_report(args.out, run_rank(args.rank_mode, args.steps, args.width, args.layers))
    else:
        drive(args.ranks, args.steps, args.width, args.layers)


if __name__ == "__main__":
    main()
