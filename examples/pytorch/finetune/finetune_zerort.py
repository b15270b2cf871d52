#!/usr/bin/env python3
"""Fine-tuning on ZeroRT, one process per rank: two param groups, linear warmup then cosine
decay, 4 micro-batches per step, bf16, clipping at 1.0, an eval pass, checkpoint and resume,
all set in ds_config.json (a DeepSpeed config). finetune_torch.py: plain PyTorch.

    mpirun -np 2 python3 finetune_zerort.py --steps 60 [--resume]  # or torchrun --nproc_per_node 2
"""
import argparse
import os

import zerort.torch
from common import CharModel, batch, evaluate, load_text, param_groups

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ds_config.json")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint", default="checkpoints-zerort")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    data, vocab = load_text()
    model = CharModel(vocab)
    engine = zerort.torch.initialize(model, CONFIG, model_parameters=param_groups(model))
    start = 0
    if args.resume:
        _, client_state = engine.load_checkpoint(args.checkpoint)
        start = client_state["step"] if client_state else 0  # None: no checkpoint yet
    for step in range(start, args.steps):
        for micro in range(engine.gradient_accumulation_steps):
            loss = model(*batch(data, step, micro, engine.rank, engine.world_size))
            engine.backward(loss)
            engine.step()
        if step % 20 == 0 or step + 1 == args.steps:
            loss, evaluation = engine.all_reduce(loss.detach(), "mean"), evaluate(model, data)
            if engine.rank == 0:
                print(f"step {step:4d}  loss {loss.item():.3f}  eval {evaluation:.3f}"
                      f"  lr {engine.get_lr()[0]:.2e}", flush=True)
    engine.save_checkpoint(args.checkpoint, client_state={"step": args.steps})
    engine.close()


if __name__ == "__main__":
    main()
