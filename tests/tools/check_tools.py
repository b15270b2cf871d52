#!/usr/bin/env python3
"""The tools run as a user runs them.

    check_tools.py BIN_DIR local   the flags checked at the door (--help, nonsense numbers,
                                   checkpoints), zero-train on in-process ranks (stages agree,
                                   --json valid, the guard patterns train) and zero-mem (the
                                   paper's figures, measure with --csv and --plot)
    check_tools.py BIN_DIR mpi     zero-train under mpirun -np 2 and 3 (stages agree, and agree
                                   with the same run on in-process ranks)
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1]
MODE = sys.argv[2]
RUN_MPI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi", "run_mpi.sh")
failures = []
CONFIG_STAGE3 = os.path.join(tempfile.mkdtemp(), "stage3.json")
with open(CONFIG_STAGE3, "w") as f:
    json.dump({"stage": 3, "stage3": {"persistence_threshold": 0, "max_live_elems": 1000000}}, f)


def check(condition, what):
    print(("ok    " if condition else "FAIL  ") + what)
    if not condition:
        failures.append(what)


def run(args, prefix=()):
    result = subprocess.run(list(prefix) + args, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:])
    return result


def train(flags, prefix=()):
    """Runs zero-train --json; returns (per-step records, summary) or None."""
    result = run([os.path.join(BIN, "zero-train"), "--json"] + flags, prefix)
    if result.returncode != 0:
        return None
    records = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return [r for r in records if not r.get("summary")], records[-1]


def close(a, b, rel):
    return abs(a - b) <= rel * max(abs(a), abs(b))


def refused(tool, args, *parts):
    """Runs a tool that must refuse `args`: a non-zero exit, and a message with every part."""
    result = subprocess.run([os.path.join(BIN, tool)] + args, capture_output=True, text=True, timeout=120)
    said = result.stdout + result.stderr
    ok = result.returncode != 0 and all(part in said for part in parts)
    if not ok:
        print(f"exit {result.returncode}:", said[-2000:])
    return ok


def check_killed_while_saving(kills=6):
    """zero-train saving after every step, killed (SIGKILL) at random moments: the directory
    always holds a complete checkpoint that loads (saves are crash-safe)."""
    rng = random.Random(7)
    loaded = 0
    with tempfile.TemporaryDirectory() as root:
        ckpt = os.path.join(root, "ckpt")
        for _ in range(kills):
            job = subprocess.Popen([os.path.join(BIN, "zero-train"), "--steps", "100000", "--ranks", "2",
                                    "--width", "256", "--checkpoint_dir", ckpt, "--save_every", "1"]
                                   + (["--resume"] if os.path.exists(ckpt) else []),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.time() + 60
            while not os.path.exists(os.path.join(ckpt, "meta.json")) and time.time() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.05, 0.6))
            job.send_signal(signal.SIGKILL)
            job.wait()
            with open(os.path.join(ckpt, "meta.json")) as f:
                saved = int(json.load(f)["user_data"])  # zero-train's position, saved inside
            resumed = train(["--steps", str(saved + 2), "--ranks", "2", "--width", "256",
                             "--checkpoint_dir", ckpt, "--resume"])
            loaded += resumed is not None
    check(loaded == kills, f"zero-train killed while saving every step, {kills} times: the checkpoint "
                           f"always loads ({loaded} of {kills})")


def check_flags():
    """Flags checked at the door: help, nonsense numbers, values that are values, checkpoints."""
    for tool, own in (("zero-train", ("--steps", "--checkpoint_dir", "--save_every")), ("zero-mem", ("--params", "--layers"))):
        for flag in ("--help", "-h"):
            result = subprocess.run([os.path.join(BIN, tool), flag], capture_output=True, text=True, timeout=60)
            check(all(f in result.stdout for f in own) and "No flags matched" not in result.stdout,
                  f"{tool} {flag} lists the tool's flags")
    check(refused("zero-train", ["--steps", "-5"], "--steps -5", "≥ 1"), "zero-train --steps -5 is refused")
    check(refused("zero-train", ["--ranks", "0"], "--ranks 0"), "zero-train --ranks 0 is refused")
    check(refused("zero-train", ["--batch", "1", "--accumulation", "2"], "--batch 1"), "--batch below --accumulation is refused")
    check(refused("zero-train", ["--lr", "2e6"], "--lr 2e6", "optimizer.lr"), "zero-train --lr 2e6 names the flag and the key")
    check(refused("zero-train", ["--lr", "inf"], "--lr inf", "finite"), "zero-train --lr inf is refused")
    check(refused("zero-train", ["--lr=1e-300"], "optimizer.lr", "1e-300"), "an lr that a float flushes to 0 is refused")
    check(refused("zero-train", ["--optimizer", 'adamw", "type": "sgd'], "optimizer.type"),
          "a flag's value is a value, not JSON text (--optimizer cannot inject a key)")
    check(refused("zero-train", ["--save_every", "5"], "--checkpoint_dir"), "--save_every without --checkpoint_dir is refused")
    check(refused("zero-train", ["--resume"], "--checkpoint_dir"), "--resume without --checkpoint_dir is refused")
    with tempfile.TemporaryDirectory() as scratch:
        bad = os.path.join(scratch, "bad.json")
        with open(bad, "w") as f:
            f.write('{"optimizer": {"eps": 2e6}}')
        check(refused("zero-train", ["--config", bad], bad, "optimizer.eps", "2e6"),
              "a config file's out-of-range value is refused at the door, naming the file, key and value")
        ckpt = os.path.join(scratch, "ckpt")
        result = subprocess.run([os.path.join(BIN, "zero-train"), "--steps", "3", "--ranks", "2", "--checkpoint_dir", ckpt],
                                capture_output=True, text=True, timeout=300)
        saved = os.path.exists(os.path.join(ckpt, "meta.json"))
        step = json.load(open(os.path.join(ckpt, "meta.json")))["user_data"] if saved else ""
        check(result.returncode == 0 and "after the last step" in result.stderr and saved and step == "3",
              "--checkpoint_dir without --save_every says so and saves after the last step")
    check(refused("zero-mem", ["measure", "--layers", "0"], "--layers 0"), "zero-mem measure --layers 0 is refused")
    check(refused("zero-mem", ["estimate", "--params", "-5"], "--params -5"), "zero-mem estimate --params -5 is refused")


if MODE == "local":
    check_flags()
    runs = {stage: train(["--stage", str(stage), "--steps", "40", "--ranks", "3"]) for stage in (0, 1, 2, 3)}
    check(all(r is not None for r in runs.values()), "zero-train runs at stages 0-3 with --json")
    if all(r is not None for r in runs.values()):
        steps, summary = runs[0]
        check(len(steps) == 40 and all("loss" in s and "grad_norm" in s for s in steps), "one JSON record per step")
        check(summary["final_loss"] < steps[0]["loss"], "the loss falls")
        check(len(summary["peak_bytes"]) == 3 and all("optimizer" in r for r in summary["peak_bytes"]),
              "the summary has peak bytes per category for every rank")
        check(len({(r[1]["final_loss"], r[1]["checksum"]) for r in runs.values()}) == 1,
              "stages 0-3 give the same final loss and checksum (bit-identical on in-process ranks)")
    # Flags not given keep the config file's values (lr 1e-3 there), so give the lr.
    sharded = train(["--stage", "3", "--steps", "20", "--ranks", "3", "--width", "400", "--lr", "0.002",
                     "--config", CONFIG_STAGE3])
    check(sharded is not None and close(sharded[1]["final_loss"],
                                        train(["--stage", "0", "--steps", "20", "--ranks", "3", "--width", "400"])[1]["final_loss"], 1e-6),
          "stage 3 with every layer sharded (no persistent units) matches stage 0")
    patterns = train(["--steps", "60", "--tied", "--branch", "--recompute", "--precision", "bf16"])
    check(patterns is not None and patterns[1]["final_loss"] < patterns[0][0]["loss"],
          "tied weights, an unused branch and re-fired gradients train under the guard policies")
    with tempfile.TemporaryDirectory() as ckpt:
        first = train(["--steps", "20", "--precision", "fp16", "--checkpoint_dir", ckpt, "--save_every", "10"])
        resumed = train(["--steps", "40", "--precision", "fp16", "--checkpoint_dir", ckpt, "--resume", "--stage", "3"])
        whole = train(["--steps", "40", "--precision", "fp16"])
        check(first is not None and resumed is not None and whole is not None and len(resumed[0]) == 20
              and (resumed[1]["final_loss"], resumed[1]["checksum"]) == (whole[1]["final_loss"], whole[1]["checksum"]),
              "checkpoint after 20 steps, resume at stage 3 to 40: identical to the uninterrupted run (fp16 scaler included)")
    check_killed_while_saving()
    with tempfile.TemporaryDirectory() as root:  # a checkpoint without zero-train's position
        ckpt = os.path.join(root, "ckpt")
        train(["--steps", "2", "--ranks", "2", "--checkpoint_dir", ckpt])
        meta_path = os.path.join(ckpt, "meta.json")
        meta = json.load(open(meta_path))
        meta["user_data"] = "abc"
        json.dump(meta, open(meta_path, "w"))
        check(refused("zero-train", ["--steps", "4", "--ranks", "2", "--checkpoint_dir", ckpt, "--resume"],
                      "cannot resume", '"abc"'),
              "--resume from a checkpoint whose trainer position is not a step is refused, not restarted at 0")
    fp16 = train(["--steps", "40", "--precision", "fp16"])
    check(fp16 is not None and fp16[1]["final_loss"] < fp16[0][0]["loss"], "fp16 with dynamic loss scaling trains")

    estimate = run([os.path.join(BIN, "zero-mem"), "estimate", "--params", "7.5e9", "--ranks", "64"])
    row = next((line for line in estimate.stdout.splitlines() if line.strip().startswith("64")), "")
    check(all(figure in row for figure in ("120.0 GB", "31.4 GB", "16.6 GB", "1.88 GB")),
          "zero-mem estimate reproduces the ZeRO paper's Table 1 row: " + row.strip())
    with tempfile.TemporaryDirectory() as scratch:
        png = os.path.join(scratch, "memory.png")
        measure = run([os.path.join(BIN, "zero-mem"), "measure", "--layers", "4", "--width", "256", "--ranks", "1,2",
                       "--csv", "--plot", png])
        rows = [line.split(",") for line in measure.stdout.splitlines()[1:]]
        check(measure.returncode == 0 and len(rows) == 8, "zero-mem measure --csv gives a row per stage 0-3 and rank count")
        check(os.path.exists(png) and os.path.getsize(png) > 1000, "zero-mem --plot draws a PNG with gnuplot")
else:
    for ranks in (2, 3):
        mpi = {stage: train(["--stage", str(stage), "--steps", "30"], (RUN_MPI, str(ranks))) for stage in (0, 1, 2, 3)}
        check(all(r is not None for r in mpi.values()), f"zero-train under mpirun -np {ranks} at stages 0-3")
        if all(r is not None for r in mpi.values()):
            base = mpi[0][1]
            check(all(close(r[1]["final_loss"], base["final_loss"], 1e-5) and close(r[1]["checksum"], base["checksum"], 1e-5)
                      for r in mpi.values()), f"np {ranks}: stages agree on final loss and checksum within 1e-5")
            with tempfile.TemporaryDirectory() as ckpt:
                half = train(["--stage", "2", "--steps", "15", "--checkpoint_dir", ckpt, "--save_every", "15"],
                             (RUN_MPI, str(ranks)))
                rest = train(["--stage", "1", "--steps", "30", "--checkpoint_dir", ckpt, "--resume"], (RUN_MPI, str(ranks)))
                check(half is not None and rest is not None and close(rest[1]["final_loss"], base["final_loss"], 1e-5),
                      f"np {ranks}: checkpoint at step 15 (stage 2), resumed at stage 1: the same run within 1e-5")
            local = train(["--stage", "2", "--steps", "30", "--ranks", str(ranks)])
            check(local is not None and close(local[1]["final_loss"], base["final_loss"], 1e-5),
                  f"np {ranks}: the MPI run matches the same run on {ranks} in-process ranks")
    # A checkpoint written by 2 MPI processes, resumed by 3 (resharded), against the same
    # save-and-resume on in-process ranks.
    with tempfile.TemporaryDirectory() as ckpt_mpi, tempfile.TemporaryDirectory() as ckpt_local:
        first_half = [train(["--stage", "2", "--steps", "15", "--checkpoint_dir", ckpt, "--save_every", "15"] + extra, launcher)
                      for ckpt, extra, launcher in ((ckpt_mpi, [], (RUN_MPI, "2")), (ckpt_local, ["--ranks", "2"], ()))]
        resumed_mpi = train(["--stage", "3", "--steps", "30", "--checkpoint_dir", ckpt_mpi, "--resume"], (RUN_MPI, "3"))
        resumed_local = train(["--stage", "3", "--steps", "30", "--checkpoint_dir", ckpt_local, "--resume", "--ranks", "3"])
        check(all(r is not None for r in first_half + [resumed_mpi, resumed_local])
              and close(resumed_mpi[1]["final_loss"], resumed_local[1]["final_loss"], 1e-5)
              and close(resumed_mpi[1]["checksum"], resumed_local[1]["checksum"], 1e-5),
              "checkpoint saved under mpirun -np 2 (stage 2), resumed under -np 3 (stage 3): "
              "the same run as on in-process ranks within 1e-5")

print(f"{len(failures)} failed" if failures else "all tool checks passed")
sys.exit(1 if failures else 0)
