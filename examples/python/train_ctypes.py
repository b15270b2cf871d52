#!/usr/bin/env python3
"""Train a small numpy model through ZeroRT's C ABI with ctypes -- no compiled glue.

Two in-process ranks (threads; ctypes releases the GIL during each call) train a linear
regression data-parallel at ZeRO stage 2 with AdamW, then the result is checked against the
same training done in one process with a plain numpy AdamW in float64.

    python3 examples/python/train_ctypes.py [path/to/libzerort.so]

Exits 0 when the sharded run matches the reference, 1 otherwise.
"""
import ctypes
import json
import os
import sys
import threading

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LIB = os.path.join(HERE, "..", "..", "build", "lib", "libzerort.so")

ZERO_OK, ZERO_FP32 = 0, 0
WORLD, STEPS, BATCH, IN, OUT = 2, 40, 16, 8, 3
CONFIG = {"stage": 2, "optimizer": {"type": "adamw", "lr": 0.05, "weight_decay": 0.01},
          "buckets": {"first_bucket_elems": 16, "reduce_bucket_elems": 32}}


class StepInfo(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("skipped", ctypes.c_int),
                ("grad_norm", ctypes.c_float), ("loss_scale", ctypes.c_float)]


def load(path):
    lib = ctypes.CDLL(path)
    lib.zero_last_error.restype = ctypes.c_char_p
    lib.zero_version.restype = ctypes.c_char_p
    lib.zero_engine_create.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.zero_register_param.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64),
                                        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_int64)]
    for name in ("zero_finalize", "zero_begin_iteration", "zero_end_backward"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    for name in ("zero_set_param", "zero_get_param", "zero_accumulate_grad"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.zero_step.argtypes = [ctypes.c_void_p, ctypes.POINTER(StepInfo)]
    lib.zero_engine_destroy.argtypes = [ctypes.c_void_p]
    lib.zero_comm_destroy.argtypes = [ctypes.c_void_p]
    return lib


def check(lib, status, what):
    if status != ZERO_OK:
        raise RuntimeError(f"{what} failed with status {status}: {lib.zero_last_error().decode()}")


def data(step):
    rng = np.random.default_rng(1000 + step)
    x = rng.uniform(-1, 1, (BATCH, IN)).astype(np.float32)
    teacher = np.random.default_rng(7).uniform(-1, 1, (OUT, IN))
    return x, (x @ teacher.T + 0.5).astype(np.float32)


def initial():
    rng = np.random.default_rng(3)
    return rng.uniform(-0.3, 0.3, (OUT, IN)).astype(np.float32), np.zeros(OUT, np.float32)


def grads(w, b, x, y):
    """Gradient of the mean over the given rows of 0.5 * ||x w^T + b - y||^2."""
    err = x @ w.T + b - y
    return err.T @ x / len(x), err.mean(axis=0), 0.5 * float((err ** 2).sum(axis=1).mean())


def rank_main(lib, comm, rank, results):
    engine = ctypes.c_void_p()
    check(lib, lib.zero_engine_create(json.dumps(CONFIG).encode(), comm, ctypes.byref(engine)), "create")
    ids = []
    for name, shape in (("linear.weight", (OUT, IN)), ("linear.bias", (OUT,))):
        dims = (ctypes.c_int64 * len(shape))(*shape)
        pid = ctypes.c_int64()
        check(lib, lib.zero_register_param(engine, name.encode(), dims, len(shape), ZERO_FP32, 1, 0, -1,
                                           ctypes.byref(pid)), f"register {name}")
        ids.append(pid.value)
    # A second registration of the same name is refused with a message naming it.
    dims = (ctypes.c_int64 * 1)(4)
    dup = lib.zero_register_param(engine, b"linear.bias", dims, 1, ZERO_FP32, 1, 0, -1, ctypes.byref(ctypes.c_int64()))
    assert dup != ZERO_OK and b"linear.bias" in lib.zero_last_error(), "duplicate names must be refused"
    check(lib, lib.zero_finalize(engine), "finalize")
    w, b = initial()
    check(lib, lib.zero_set_param(engine, ids[0], w.ctypes.data), "set weight")
    check(lib, lib.zero_set_param(engine, ids[1], b.ctypes.data), "set bias")
    half = BATCH // WORLD
    losses = []
    for step in range(STEPS):
        x, y = data(step)
        w = np.empty((OUT, IN), np.float32)
        b = np.empty(OUT, np.float32)
        check(lib, lib.zero_get_param(engine, ids[0], w.ctypes.data), "get weight")
        check(lib, lib.zero_get_param(engine, ids[1], b.ctypes.data), "get bias")
        losses.append(grads(w, b, x, y)[2])
        gw, gb, _ = grads(w, b, x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half])
        gw, gb = np.ascontiguousarray(gw, np.float32), np.ascontiguousarray(gb, np.float32)
        check(lib, lib.zero_begin_iteration(engine), "begin")
        check(lib, lib.zero_accumulate_grad(engine, ids[1], gb.ctypes.data), "bias grad")   # backward order
        check(lib, lib.zero_accumulate_grad(engine, ids[0], gw.ctypes.data), "weight grad")
        check(lib, lib.zero_end_backward(engine), "end backward")
        info = StepInfo()
        check(lib, lib.zero_step(engine, ctypes.byref(info)), "step")
    final_w = np.empty((OUT, IN), np.float32)
    final_b = np.empty(OUT, np.float32)
    check(lib, lib.zero_get_param(engine, ids[0], final_w.ctypes.data), "get weight")
    check(lib, lib.zero_get_param(engine, ids[1], final_b.ctypes.data), "get bias")
    lib.zero_engine_destroy(engine)
    results[rank] = (losses, final_w, final_b)


def reference():
    """The same training in one process: full batch, numpy AdamW in float64 (PyTorch's rule)."""
    w, b = (p.astype(np.float64) for p in initial())
    opt = CONFIG["optimizer"]
    lr, wd, b1, b2, eps = opt["lr"], opt["weight_decay"], 0.9, 0.999, 1e-8
    m = [np.zeros_like(w), np.zeros_like(b)]
    v = [np.zeros_like(w), np.zeros_like(b)]
    losses = []
    for step in range(STEPS):
        x, y = data(step)
        gw, gb, loss = grads(w, b, x.astype(np.float64), y.astype(np.float64))
        losses.append(loss)
        t = step + 1
        for i, (p, g) in enumerate(((w, gw), (b, gb))):
            p *= 1 - lr * wd
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            p -= lr / (1 - b1 ** t) * m[i] / (np.sqrt(v[i]) / np.sqrt(1 - b2 ** t) + eps)
    return losses, w, b


def main():
    lib = load(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_LIB)
    print(lib.zero_version().decode())
    comms = (ctypes.c_void_p * WORLD)()
    check(lib, lib.zero_comm_local_group(WORLD, comms), "local group")
    results = [None] * WORLD
    errors = []

    def run(rank):
        try:
            rank_main(lib, comms[rank], rank, results)
        except Exception as e:  # reported below; a failing rank must not hang the other
            errors.append(f"rank {rank}: {e}")

    threads = [threading.Thread(target=run, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in comms:
        lib.zero_comm_destroy(c)
    if errors:
        print("\n".join(errors))
        return 1
    ref_losses, ref_w, ref_b = reference()
    losses, w, b = results[0]
    for step in range(0, STEPS, 10):
        print(f"step {step:3d}  loss {losses[step]:.6f}  reference {ref_losses[step]:.6f}")
    worst = max(np.abs(w - ref_w).max(), np.abs(b - ref_b).max())
    same_ranks = all(np.array_equal(results[r][1], w) and np.array_equal(results[r][2], b) for r in range(WORLD))
    print(f"final loss {losses[-1]:.6f} (from {losses[0]:.6f}); max |param - reference| = {worst:.2e}; "
          f"ranks identical: {same_ranks}")
    ok = worst < 1e-4 and same_ranks and losses[-1] < 0.2 * losses[0]
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
