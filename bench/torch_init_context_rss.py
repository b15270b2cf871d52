#!/usr/bin/env python3
"""Peak resident memory per rank of building a model whole against inside init_context.

    tests/mpi/run_mpi.sh N python3 bench/torch_init_context_rss.py [--sharded]
                                               [--layers 8] [--width 4096]

Model: `layers` frozen Linear(width, width) with a rank-8 trainable adapter each (fp32; 537 MB
at the defaults). Without --sharded every rank builds the model whole, then initialize() at
stage 3 shards it; with --sharded it is built inside zerort.torch.init_context. One process
per rank, a fresh process per mode (the peak RSS, ru_maxrss, only grows). Rank 0 prints, per
rank, the peak RSS before building (Python, PyTorch, MPI), after building, and after
initialize(), and the model's size.
"""
import argparse
import resource

import torch
from torch import nn

import zerort
import zerort.torch


class LoraLayer(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.base = nn.Linear(width, width, bias=False)
        self.base.requires_grad_(False)
        self.lora_a = nn.Linear(width, 8, bias=False)
        self.lora_b = nn.Linear(8, width, bias=False)


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sharded", action="store_true")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = zerort.mpi_communicator()
    before = peak_mb()
    if args.sharded:
        with zerort.torch.init_context(comm):
            model = nn.Sequential(*[LoraLayer(args.width) for _ in range(args.layers)])
    else:
        model = nn.Sequential(*[LoraLayer(args.width) for _ in range(args.layers)])
    built = peak_mb()
    engine = zerort.torch.initialize(model, {"stage": 3, "guard": {"timeout_s": 300}}, comm)
    initialized = peak_mb()
    model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    rows = torch.tensor([before, built, initialized], dtype=torch.float32)
    everyone = [torch.zeros(3) for _ in range(comm.size)]
    for rank in range(comm.size):  # rank r's row to every rank
        row = rows.clone() if rank == comm.rank else everyone[rank]
        comm.broadcast_bytes(row.data_ptr(), 12, rank, 300.0)
        everyone[rank] = row
    engine.close()
    if comm.rank == 0:
        mode = "init_context" if args.sharded else "built whole"
        print(f"{mode}: model {model_mb:.0f} MB, {comm.size} rank(s); peak RSS per rank, MB")
        print("rank  before building  after building  after initialize")
        for rank, (b, m, i) in enumerate(row.tolist() for row in everyone):
            print(f"{rank:4d}  {b:15.0f}  {m:14.0f}  {i:16.0f}")
    comm.close()


if __name__ == "__main__":
    main()
