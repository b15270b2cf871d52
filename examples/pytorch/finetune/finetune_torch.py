#!/usr/bin/env python3
"""Fine-tuning in plain PyTorch, one process: two param groups, linear warmup then cosine
decay, 4 micro-batches per step, bf16, clipping at 1.0, an eval pass, checkpoint and resume.
finetune_zerort.py is the same loop on ZeroRT, set by ds_config.json (a DeepSpeed config).

    python3 finetune_torch.py --steps 60 [--resume]
"""
import argparse
import math
import os

import torch

from common import CharModel, batch, evaluate, load_text, param_groups

WARMUP, ACCUMULATION = 10, 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint", default="checkpoints-torch")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    data, vocab = load_text()
    model = CharModel(vocab)
    optimizer = torch.optim.AdamW(param_groups(model), lr=3e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(
        s / WARMUP, 0.5 * (1 + math.cos(math.pi * (s - WARMUP) / (args.steps - WARMUP)))))
    start = 0
    if args.resume:
        state = torch.load(os.path.join(args.checkpoint, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        start = state["step"]
    for step in range(start, args.steps):
        for micro in range(ACCUMULATION):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(*batch(data, step, micro))
            (loss / ACCUMULATION).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 20 == 0 or step + 1 == args.steps:
            print(f"step {step:4d}  loss {loss.item():.3f}  eval {evaluate(model, data):.3f}"
                  f"  lr {schedule.get_last_lr()[0]:.2e}", flush=True)
    os.makedirs(args.checkpoint, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(), "step": args.steps},
               os.path.join(args.checkpoint, "state.pt"))


if __name__ == "__main__":
    main()
