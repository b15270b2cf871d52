#!/usr/bin/env python3
"""A character-level GPT with LoRA adapters and reentrant activation checkpointing, trained
data-parallel with ZeroRT (or with PyTorch DDP, to see how DDP fails on the same model).

The text is the GPL-3 that every Debian system ships (/usr/share/common-licenses/GPL-3).
The "pretrained" weights (embeddings, attention, MLP) are frozen; the trainable params are
the LayerNorms, the head and one pair of LoRA adapters that every block shares (tied
adapters, as in parameter-sharing fine-tuning). Every block runs under
torch.utils.checkpoint(..., use_reentrant=True), so the shared adapters' gradient arrives
once per block: DDP stops with "Expected to mark a variable ready only once"; ZeroRT with
guard.on_duplicate = "count" adds the arrivals up and trains.

    python3 train_char_lora.py --ranks 2 --stage 2          # in-process ranks (threads)
    mpirun -np 2 python3 train_char_lora.py --stage 3        # one process per rank
    mpirun -np 2 python3 train_char_lora.py --engine ddp     # the same run under DDP

Needs PYTHONPATH to hold ZeroRT's python/ folder (and ZERORT_LIBRARY, or a build in
build/lib/ beside it).
"""
import argparse
import math
import os
import threading

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

TEXT = "/usr/share/common-licenses/GPL-3"
CONTEXT, DIM, HEADS, LAYERS, LORA_RANK, BATCH = 32, 64, 4, 4, 8, 16


class SharedLora(nn.Module):
    """x -> B(A(x)) · scale: a low-rank update, shared by every block."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(DIM, LORA_RANK, bias=False)
        self.b = nn.Linear(LORA_RANK, DIM, bias=False)
        nn.init.normal_(self.b.weight, std=0.02)

    def forward(self, x):
        return self.b(self.a(x)) * 0.5


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP; frozen base weights, the shared adapter."""

    def __init__(self, adapter):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attention = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.attention.requires_grad_(False)
        self.mlp.requires_grad_(False)
        self.adapter = adapter

    def forward(self, x):
        h = self.norm1(x)
        causal = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        attended, _ = self.attention(h, h, h, attn_mask=causal, need_weights=False)
        x = x + attended + self.adapter(h)
        return x + self.mlp(self.norm2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, DIM)
        self.position = nn.Parameter(torch.randn(CONTEXT, DIM) * 0.02)
        self.embed.requires_grad_(False)
        self.position.requires_grad_(False)
        adapter = SharedLora()
        self.blocks = nn.ModuleList(Block(adapter) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, vocab)

    def forward(self, tokens):
        # The input of the checkpointed blocks must require grad, or reentrant checkpointing
        # gives every param inside them no gradient (ZeroRT would say so, naming them).
        x = (self.embed(tokens) + self.position[:tokens.shape[1]]).requires_grad_()
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True)
        return self.head(self.norm(x))


def load_text():
    with open(TEXT, encoding="utf-8") as file:
        text = file.read()
    chars = sorted(set(text))
    return torch.tensor([chars.index(c) for c in text]), len(chars)


def batch(data, step, rank, world):
    """This rank's share of the step's batch (the same windows on every run)."""
    generator = torch.Generator().manual_seed(step)
    starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=generator)
    mine = starts[rank * BATCH // world:(rank + 1) * BATCH // world]
    tokens = torch.stack([data[s:s + CONTEXT] for s in mine])
    targets = torch.stack([data[s + 1:s + CONTEXT + 1] for s in mine])
    return tokens, targets


def train_zerort(comm, model, args, data, vocab, losses):
    """Trains `model` on `comm`'s rank; appends rank 0's losses to `losses`."""
    import zerort.torch
    config = {"stage": args.stage, "optimizer": {"type": "adamw", "lr": 3e-3},
              "guard": {"on_duplicate": args.on_duplicate, "timeout_s": 120}}
    engine = zerort.torch.initialize(model, config, comm)
    for step in range(args.steps):
        tokens, targets = batch(data, step, comm.rank, comm.size)
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        engine.step()
        if comm.rank == 0:
            losses.append(loss.item())
        if comm.rank == 0 and (step % 25 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.3f}  (uniform: {math.log(vocab):.3f})",
                  flush=True)
    engine.close()


def train_ddp(args, data, vocab):
    import torch.distributed as dist
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = nn.parallel.DistributedDataParallel(CharGPT(vocab))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    for step in range(args.steps):
        tokens, targets = batch(data, step, rank, world)
        loss = F.cross_entropy(model(tokens).reshape(-1, vocab), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 25 == 0:
            print(f"step {step:4d}  loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["zerort", "ddp"], default="zerort")
    parser.add_argument("--stage", type=int, default=2, choices=[0, 1, 2, 3])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--on_duplicate", choices=["count", "error"], default="count",
                        help="guard.on_duplicate (error: see the message ZeroRT gives)")
    parser.add_argument("--ranks", type=int, default=1,
                        help="in-process ranks (threads); ignored under mpirun")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data, vocab = load_text()
    if args.engine == "ddp":
        train_ddp(args, data, vocab)
        return
    import zerort
    losses = []
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        train_zerort(zerort.mpi_communicator(), CharGPT(vocab), args, data, vocab, losses)
    else:
        comms = zerort.local_group(args.ranks)
        # Models built here: CharGPT seeds PyTorch's global generator, which threads share.
        models = [CharGPT(vocab) for _ in comms]
        failures = []

        def run(comm, model):
            try:
                train_zerort(comm, model, args, data, vocab, losses)
            except Exception as error:  # noqa: BLE001 - every rank's error is printed
                failures.append(f"rank {comm.rank}: {type(error).__name__}: {error}")

        threads = [threading.Thread(target=run, args=(c, m)) for c, m in zip(comms, models)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise SystemExit("\n".join(failures))
    if losses:  # rank 0: the loss must have fallen (mean of the last 10 against the first)
        tail = sum(losses[-10:]) / len(losses[-10:])
        print(f"loss {losses[0]:.3f} -> {tail:.3f} (mean of the last 10 steps)")
        raise SystemExit(0 if tail < 0.8 * losses[0] else 1)


if __name__ == "__main__":
    main()
