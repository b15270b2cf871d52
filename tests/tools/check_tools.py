#!/usr/bin/env python3
"""The tools run as a user runs them.

    check_tools.py BIN_DIR local   the flags checked at the door (--help, nonsense numbers,
                                   checkpoints), zero-train on in-process ranks (stages agree,
                                   --json valid, the guard patterns train, killed and
                                   preempted runs resume), zero-ckpt (inspect, verify,
                                   consolidate read back by an independent safetensors reader,
                                   reshard) and zero-mem (the paper's figures, measure with
                                   --csv and --plot)
    check_tools.py BIN_DIR mpi     zero-train under mpirun -np 2 and 3 (stages agree, agree with
                                   the same run on in-process ranks, SIGUSR1 to mpirun saves and
                                   resumes)
    check_tools.py BIN_DIR params CKPT   (used by the checks above) every param of CKPT as an
                                   engine's GetParam gives it, as JSON of hex fp32 bytes
"""
import ctypes
import json
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1]
MODE = sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
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


def check_lr_schedule():
    """--lr_schedule: every step's lr is DeepSpeed's for the schedule, and a DeepSpeed config
    file (--config ds.json) drives a run."""
    runs = train(["--steps", "10", "--ranks", "2", "--lr", "0.01", "--lr_schedule", "WarmupDecayLR",
                  "--warmup_steps", "4"])
    # DeepSpeed's WarmupDecayLR, linear warmup: step n runs at last_batch_iteration it = n - 2;
    # lr = 0.01 * it / 4 while it < 4, then 0.01 * (10 - it) / (10 - 4).
    expected = [0.0, 0.0, 0.0025, 0.005, 0.0075, 0.01] + [0.01 * (10 - it) / 6 for it in (5, 6, 7, 8)]
    lrs = [r["lr"] for r in runs[0]] if runs else []
    check(len(lrs) == 10 and all(close(a, b, 1e-6) or abs(a - b) < 1e-9 for a, b in zip(lrs, expected)),
          f"zero-train --lr_schedule WarmupDecayLR: each step's lr is DeepSpeed's ({lrs})")
    with tempfile.TemporaryDirectory() as root:
        ds = os.path.join(root, "ds.json")
        with open(ds, "w") as f:
            json.dump({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
                       "zero_optimization": {"stage": 2, "contiguous_gradients": True},
                       "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
                       "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3,
                                                                     "warmup_type": "linear"}},
                       "gradient_clipping": 1.0}, f)
        runs = train(["--config", ds, "--steps", "30", "--ranks", "2"])
        check(runs is not None and runs[0][-1]["loss"] < runs[0][0]["loss"]
              and close(runs[0][-1]["lr"], 2e-3, 1e-6),
              "zero-train --config ds.json (a DeepSpeed config): trains, at the schedule's lr")
        ckpt = os.path.join(root, "ckpt")
        train(["--config", ds, "--steps", "5", "--save_every", "1", "--checkpoint_dir", ckpt])
        kept = sorted(name for name in os.listdir(ckpt) if not name.startswith("."))  # the lock
        check(kept == ["latest", "step-4", "step-5"],
              f"zero-train --config ds.json: --keep_last's default (2) holds where the config sets "
              f"no checkpoint.keep_last ({kept})")
        with open(ds, "w") as f:
            json.dump({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                       "amp": {"enabled": True}}, f)
        check(refused("zero-train", ["--config", ds, "--steps", "2"], "offload_optimizer", "amp"),
              "zero-train --config ds.json: every unsupported DeepSpeed key is named in one error")


def latest(root):
    """The checkpoint directory root/latest names."""
    with open(os.path.join(root, "latest")) as f:
        return os.path.join(root, f.read().strip())


def saved_position(root):
    """zero-train's position, saved inside its newest checkpoint (user data)."""
    with open(os.path.join(latest(root), "meta.json")) as f:
        return int(json.load(f)["user_data"])


def check_preempted(signum, launcher=(), flags=()):
    """zero-train sent `signum` mid-run (to itself, or to mpirun which forwards it): it saves
    at the next step boundary, exits 0, and --resume continues to the same result as the
    uninterrupted run."""
    name = signal.Signals(signum).name
    where = f"under mpirun -np {launcher[1]}" if launcher else "in-process"
    with tempfile.TemporaryDirectory() as root:
        ckpt = os.path.join(root, "ckpt")
        common = ["--width", "192", "--checkpoint_dir", ckpt] + list(flags)
        job = subprocess.Popen(list(launcher) + [os.path.join(BIN, "zero-train"), "--json", "--steps", "100000"]
                               + common, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for line in job.stdout:  # a few steps in
            if json.loads(line).get("step", 0) >= 3:
                break
        job.send_signal(signum)
        out, err = job.communicate(timeout=300)
        stopped = job.returncode == 0 and "stop requested" in err
        if not stopped:
            print(f"exit {job.returncode}:", err[-2000:])
        position = saved_position(ckpt) if stopped else -1
        summary = json.loads(out.strip().splitlines()[-1]) if stopped else {}
        check(summary.get("steps") == position and summary.get("of_steps") == 100000
              and summary.get("preempted") is True,
              f"zero-train {where} given {name}: the summary gives the steps done ({summary})")
        resumed = train(["--steps", str(position + 5), "--resume"] + common, launcher) if stopped else None
        whole = train(["--steps", str(position + 5)] + common[:2] + list(flags), launcher) if stopped else None
        check(stopped and position >= 3 and resumed is not None and whole is not None
              and len(resumed[0]) == 5 and resumed[1]["checksum"] == whole[1]["checksum"],
              f"zero-train {where} given {name} after step {position}: saved at the step boundary, "
              f"exited 0, and --resume gives the uninterrupted run's result")


def check_slurm_example():
    """examples/slurm/train.sbatch with stand-ins for srun and scontrol: SIGUSR1 to the batch
    shell (what --signal=B:USR1@120 does) reaches the ranks, they save and exit 0, the script
    requeues; run again, it resumes from the checkpoint."""
    script = os.path.join(HERE, "..", "..", "examples", "slurm", "train.sbatch")
    with tempfile.TemporaryDirectory() as root:
        stubs = os.path.join(root, "bin")
        os.makedirs(stubs)
        for name, body in (("srun", 'shift\nexec "$@" --ranks 2 --width 128'),
                           ("scontrol", 'echo "scontrol $*" >> "$CKPT.requeued"')):
            with open(os.path.join(stubs, name), "w") as f:
                f.write("#!/bin/sh\n" + body + "\n")
            os.chmod(os.path.join(stubs, name), 0o755)
        env = dict(os.environ, PATH=stubs + os.pathsep + os.environ["PATH"], SLURM_JOB_ID="42",
                   ZERO_TRAIN=os.path.join(BIN, "zero-train"), CKPT=os.path.join(root, "ckpt"))
        job = subprocess.Popen(["bash", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for line in job.stdout:
            if line.startswith("{") and json.loads(line).get("step", 0) >= 3:
                break
        job.send_signal(signal.SIGUSR1)
        out, err = job.communicate(timeout=300)
        requeued = os.path.exists(env["CKPT"] + ".requeued") and "requeue 42" in open(env["CKPT"] + ".requeued").read()
        position = saved_position(env["CKPT"]) if job.returncode == 0 else -1
        if job.returncode != 0 or not requeued:
            print(f"exit {job.returncode}:", out[-1000:], err[-2000:])
        again = subprocess.Popen(["bash", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for line in again.stdout:
            break  # the first step record: the run is under way
        again.send_signal(signal.SIGUSR1)
        _, err2 = again.communicate(timeout=300)
        check(job.returncode == 0 and requeued and position >= 3 and again.returncode == 0
              and f"resumed from {env['CKPT']} at step {position}" in err2,
              f"examples/slurm/train.sbatch: SIGUSR1 to the batch shell saves step {position}, exits 0 and "
              "requeues; the requeued job resumes there")


def check_rank_failure_ends_the_job():
    """One rank of a zero-train job under mpirun dies (SIGKILL, as a node failure): the whole
    job ends within seconds with a non-zero status instead of hanging."""
    job = subprocess.Popen([RUN_MPI, "3", os.path.join(BIN, "zero-train"), "--json", "--steps", "100000",
                            "--width", "128"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in job.stdout:
        if json.loads(line).get("step", 0) >= 2:
            break
    ranks = subprocess.run(["pgrep", "-P", str(job.pid), "-f", "zero-train"], capture_output=True, text=True)
    victims = ranks.stdout.split()
    if victims:
        os.kill(int(victims[-1]), signal.SIGKILL)
    start = time.time()
    try:
        job.communicate(timeout=60)
        elapsed = time.time() - start
    except subprocess.TimeoutExpired:
        job.kill()
        job.communicate()
        elapsed = float("inf")
    check(bool(victims) and job.returncode != 0 and elapsed < 30,
          f"a rank of a 3-rank job killed mid-run: the job ends in {elapsed:.1f} s with status {job.returncode}")


def check_zero_ckpt():
    """zero-ckpt on a checkpoint written by zero-train: inspect, verify (and a damaged copy),
    consolidate (read back by a small independent safetensors reader, compared with the
    engine's GetParam after loading), reshard (resumes like the original)."""
    tool = os.path.join(BIN, "zero-ckpt")
    with tempfile.TemporaryDirectory() as root:
        ckpt = os.path.join(root, "ckpt")
        flags = ["--ranks", "2", "--stage", "3", "--depth", "2", "--width", "24"]
        train(["--steps", "6"] + flags + ["--checkpoint_dir", ckpt])
        inspect = run([tool, "inspect", ckpt])
        check(inspect.returncode == 0 and all(part in inspect.stdout for part in (
            "format 4", "step 6", "stage 3", "world 2", "adamw", "layer0.weight", "[24, 24]",
            "rank-1-of-2.bin", "every checksum matches")), "zero-ckpt inspect says what a checkpoint holds")
        check(run([tool, "verify", ckpt]).returncode == 0, "zero-ckpt verify: exit 0 on an intact checkpoint")
        check(refused("zero-ckpt", ["consolidate", ckpt, "--out", os.path.join(ckpt, "latest")],
                      "would replace", "latest")
              and run([tool, "verify", ckpt]).returncode == 0,
              "zero-ckpt consolidate --out SERIES/latest is refused and the series stays resumable")
        check(refused("zero-ckpt", ["consolidate", latest(ckpt), "--out", os.path.join(ckpt, "latest")],
                      "would replace", "latest"),
              "zero-ckpt consolidate of one checkpoint of a series refuses --out SERIES/latest too")
        check(refused("zero-ckpt", ["inspect", ckpt, "--world", "3"], "--world", "reshard")
              and refused("zero-ckpt", ["verify", ckpt, "--out", "x"], "--out", "consolidate"),
              "zero-ckpt refuses a flag of another command instead of ignoring it")
        damaged = os.path.join(root, "damaged")
        subprocess.run(["cp", "-r", latest(ckpt), damaged], check=True)
        victim = os.path.join(damaged, "rank-1-of-2.bin")
        with open(victim, "r+b") as f:
            f.seek(-7, os.SEEK_END)
            byte = f.read(1)
            f.seek(-7, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0x10]))
        check(refused("zero-ckpt", ["verify", damaged], "rank-1-of-2.bin", "corrupt"),
              "zero-ckpt verify: a flipped byte is a non-zero exit naming the file")
        os.remove(victim)
        check(refused("zero-ckpt", ["verify", damaged], "rank-1-of-2.bin", "missing"),
              "zero-ckpt verify: a missing rank file is a non-zero exit naming it")
        os.mkfifo(victim)  # opened for reading, a FIFO waits for a writer that never comes
        check(refused("zero-ckpt", ["verify", damaged], "rank-1-of-2.bin", "not a regular file")
              and refused("zero-ckpt", ["inspect", damaged], "DAMAGED"),
              "zero-ckpt verify and inspect: a rank file that is a FIFO is refused, not waited on")
        os.remove(victim)
        series = os.path.join(root, "series")  # saved after steps 3 and 6
        train(["--steps", "6", "--save_every", "3"] + flags + ["--checkpoint_dir", series])
        mixed = os.path.join(root, "mixed")
        shutil.copytree(os.path.join(series, "step-6"), mixed)
        shutil.copy(os.path.join(series, "step-3", "rank-1-of-2.bin"), mixed)
        check(refused("zero-ckpt", ["verify", mixed], "rank-1-of-2.bin", "another save")
              and refused("zero-train", ["--steps", "9", "--resume", "--checkpoint_dir", mixed]
                          + flags, "rank-1-of-2.bin", "another save"),
              "a rank file copied from another save (same layout): verify and --resume refuse it")
        for dtype in ("fp32", "bf16"):
            out = os.path.join(root, f"model-{dtype}.safetensors")
            made = run([tool, "consolidate", ckpt, "--out", out, "--dtype", dtype])
            check(made.returncode == 0 and consolidated_matches(out, ckpt, dtype),
                  f"zero-ckpt consolidate --dtype {dtype}: the safetensors file holds every param as "
                  f"the engine's GetParam gives it")
        inside = os.path.join(latest(ckpt), "meta.json")
        check(refused("zero-ckpt", ["consolidate", ckpt, "--out", inside], "inside the checkpoint")
              and run([tool, "verify", ckpt]).returncode == 0,
              "zero-ckpt consolidate --out CK/meta.json: refused, and the checkpoint still verifies")
        check(refused("zero-ckpt", ["consolidate", ckpt, "--out", root], "is a directory",
                      "model.safetensors"),
              "zero-ckpt consolidate --out DIR: refused, naming a file to write instead")
        wide = os.path.join(root, "wide")
        with open(tool, "rb") as binary:  # AddressSanitizer reserves terabytes of address space
            sanitized = b"__asan_init" in binary.read()
        limit = None if sanitized else lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        limited = subprocess.run([tool, "reshard", ckpt, "--world", "1024", "--out", wide],
                                 capture_output=True, text=True, timeout=300, preexec_fn=limit)
        check(limited.returncode == 0 and run([tool, "verify", wide]).returncode == 0,
              "zero-ckpt reshard --world 1024 under a 1 GiB address-space limit (none under ASan): done "
              "and intact (no engine or thread per rank)" + ("" if limited.returncode == 0 else limited.stderr[-500:]))
        resharded = os.path.join(root, "three")
        made = run([tool, "reshard", ckpt, "--world", "3", "--out", resharded])
        files = sorted(os.listdir(resharded)) if made.returncode == 0 else []
        check(refused("zero-ckpt", ["reshard", ckpt, "--world", "2", "--out", resharded],
                      "holds a checkpoint already") and sorted(os.listdir(resharded)) == files,
              "zero-ckpt reshard --out naming an existing checkpoint is refused and leaves it as it was")
        more = ["--steps", "9", "--resume", "--ranks", "3"] + flags[2:]
        a, b = train(more + ["--checkpoint_dir", resharded]), train(more + ["--checkpoint_dir", ckpt])
        check(files == ["meta.json", "rank-0-of-3.bin", "rank-1-of-3.bin", "rank-2-of-3.bin"]
              and a is not None and b is not None and a[1]["checksum"] == b[1]["checksum"],
              "zero-ckpt reshard --world 3: three rank files, and resuming from them equals resuming "
              "from the original")


def read_safetensors(path):
    """A small reader of the safetensors format: {name: (dtype, shape, raw bytes)}."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    header.pop("__metadata__", None)
    return {name: (entry["dtype"], entry["shape"], data[entry["data_offsets"][0]:entry["data_offsets"][1]])
            for name, entry in header.items()}


def bf16(value):
    """fp32 → bf16 bits, round to nearest even (finite values)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def engine_params(ckpt):
    """{name: raw fp32 bytes} of every param as an engine gives them (GetParam) after loading
    `ckpt`: the zerort package of this tree over BIN's library, in a python3 of its own (with
    the ASan runtime preloaded when BIN is a sanitizer build)."""
    env = dict(os.environ, ZERORT_LIBRARY=os.path.join(BIN, "..", "lib", "libzerort.so"))
    runtime = os.path.join(BIN, "..", "zero_asan_runtime.txt")
    if os.path.exists(runtime):
        env.update(LD_PRELOAD=open(runtime).read().strip(), ASAN_OPTIONS="detect_leaks=0")
    result = subprocess.run([sys.executable, os.path.abspath(__file__), BIN, "params", ckpt],
                            capture_output=True, text=True, timeout=300, env=env)
    if result.returncode != 0:
        print(result.stderr[-2000:])
        return {}
    return {name: bytes.fromhex(raw) for name, raw in json.loads(result.stdout).items()}


def print_engine_params(ckpt):
    """The `params` mode: prints {name: hex of the fp32 values} of every param of `ckpt`."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import zerort  # noqa: E402 - the package of this source tree
    with open(os.path.join(latest(ckpt), "meta.json")) as f:
        params = json.load(f)["params"]
    comm = zerort.local_group(1)[0]
    engine = zerort.Engine({"stage": 1}, comm)
    for p in params:
        engine.register_param(p["name"], p["shape"])
    engine.finalize()
    engine.load_checkpoint(ckpt)
    out = {}
    for pid, p in enumerate(params):
        numel = 1
        for d in p["shape"]:
            numel *= d
        values = (ctypes.c_float * numel)()
        engine.get_param(pid, ctypes.addressof(values))
        out[p["name"]] = bytes(values).hex()
    engine.close()
    comm.close()
    print(json.dumps(out))


def consolidated_matches(path, ckpt, dtype):
    """Every param of the safetensors file equals the engine's value after loading `ckpt`."""
    tensors = read_safetensors(path)
    with open(os.path.join(latest(ckpt), "meta.json")) as f:
        params = json.load(f)["params"]
    values = engine_params(ckpt)
    ok = sorted(tensors) == sorted(p["name"] for p in params) == sorted(values)
    for p in params:
        raw_fp32 = values.get(p["name"], b"")
        floats = struct.unpack(f"<{len(raw_fp32) // 4}f", raw_fp32)
        kind, shape, raw = tensors.get(p["name"], (None, None, b""))
        want = raw_fp32 if dtype == "fp32" else struct.pack(f"<{len(floats)}H", *(bf16(v) for v in floats))
        ok = ok and kind == dtype.upper().replace("FP", "F") and shape == p["shape"] and raw == want
    return ok


def check_killed_while_saving(kills=6, launcher=()):
    """zero-train saving after every step, killed (SIGKILL; under mpirun every process of the
    job at once) at random moments: the directory always holds a complete checkpoint that
    loads (saves are crash-safe)."""
    rng = random.Random(7)
    loaded = 0
    where = f"under mpirun -np {launcher[1]}" if launcher else "in-process"
    with tempfile.TemporaryDirectory() as root:
        ckpt = os.path.join(root, "ckpt")
        flags = ["--width", "256", "--checkpoint_dir", ckpt] + ([] if launcher else ["--ranks", "2"])
        for _ in range(kills):
            job = subprocess.Popen(list(launcher) + [os.path.join(BIN, "zero-train"), "--steps", "100000",
                                                     "--save_every", "1"] + flags
                                   + (["--resume"] if os.path.exists(ckpt) else []),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.time() + 60
            while not os.path.exists(os.path.join(ckpt, "latest")) and time.time() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.05, 0.6))
            if launcher:  # mpirun and its ranks: every process naming this checkpoint directory
                subprocess.run(["pkill", "-KILL", "-f", ckpt])
            job.send_signal(signal.SIGKILL)
            job.wait()
            saved = saved_position(ckpt)
            resumed = train(["--steps", str(saved + 2), "--resume"] + flags, launcher)
            loaded += resumed is not None
    check(loaded == kills, f"zero-train {where} killed while saving every step, {kills} times: the "
                           f"checkpoint always loads ({loaded} of {kills})")


def check_killed_in_its_first_save():
    """What a job killed inside its first save leaves (the series' lock file and
    step-1.partial) holds no checkpoint: --resume starts at step 0 (a requeued job failed for
    good on the lock file)."""
    with tempfile.TemporaryDirectory() as root:
        ckpt = os.path.join(root, "ckpt")
        os.makedirs(os.path.join(ckpt, "step-1.partial"))
        open(os.path.join(ckpt, ".zerort-lock"), "w", encoding="utf-8").close()
        resumed = train(["--steps", "2", "--ranks", "2", "--width", "64", "--checkpoint_dir", ckpt,
                         "--resume"])
        check(resumed is not None and len(resumed[0]) == 2,
              "--resume after a kill inside the first save starts at step 0")


def check_flags():
    """Flags checked at the door: help, nonsense numbers, values that are values, checkpoints."""
    for tool, own in (("zero-train", ("--steps", "--checkpoint_dir", "--save_every", "--keep_last")),
                      ("zero-mem", ("--params", "--layers")), ("zero-ckpt", ("--out", "--dtype", "--world"))):
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
        saved = os.path.exists(os.path.join(ckpt, "latest"))
        step = str(saved_position(ckpt)) if saved else ""
        check(result.returncode == 0 and "after the last step" in result.stderr and saved and step == "3",
              "--checkpoint_dir without --save_every says so and saves after the last step")
        check(refused("zero-train", ["--steps", "2", "--ranks", "2", "--checkpoint_dir", ckpt],
                      "earlier run", "--resume") and saved_position(ckpt) == 3,
              "a run from step 0 into another run's series is refused, its checkpoints kept")
    check(refused("zero-mem", ["measure", "--layers", "0"], "--layers 0"), "zero-mem measure --layers 0 is refused")
    check(refused("zero-mem", ["measure", "--layers", "1000000000", "--width", "1"], "--layers 1000000000", "10000"),
          "zero-mem measure --layers 1e9 --width 1 is refused instead of running for hours")
    check(refused("zero-mem", ["estimate", "--params", "-5"], "--params -5"), "zero-mem estimate --params -5 is refused")
    check(refused("zero-mem", ["estimate", "--params", "0.5"], "--params 0.5"),
          "zero-mem estimate --params 0.5 (less than one param) is refused")
    check(refused("zero-mem", ["estimate", "--params", "1e9", "--plot", "memory.pdf"], ".png or .svg"),
          "zero-mem --plot memory.pdf is refused (it wrote PNG data under that name)")
    lamb = subprocess.run([os.path.join(BIN, "zero-mem"), "estimate", "--params", "1e9", "--optimizer", "lamb"],
                          capture_output=True, text=True, timeout=60)
    check(lamb.returncode == 0 and "optimizer K = 12" in lamb.stdout,
          "zero-mem estimate --optimizer lamb (zero-train offers it) counts m and v beside the master")
    check(refused("zero-mem", ["estimate", "--preset", "llama-7b", "--params", "1e9"], "both give"),
          "zero-mem estimate --preset with --params is refused (the preset won silently)")
    check(refused("zero-mem", ["estimate", "--params", "1e9", "--layers=4"], "--layers", "measure"),
          "zero-mem estimate --layers (a flag of measure) is refused, not ignored")
    check(refused("zero-mem", ["measure", "--frozen_fraction", "0.5"], "--frozen_fraction", "--lora_rank"),
          "zero-mem measure --frozen_fraction (a flag of estimate) is refused, naming measure's own")


def check_resume_edges():
    """What a resubmitted job meets: a run already complete, flags that change the lr, a
    checkpoint path that is a file, a --config that is a directory, a config's batch section."""
    with tempfile.TemporaryDirectory() as scratch:
        ckpt = os.path.join(scratch, "ckpt")
        common = ["--ranks", "2", "--checkpoint_dir", ckpt]
        first = train(["--steps", "3"] + common)
        again = run([os.path.join(BIN, "zero-train"), "--json", "--steps", "3", "--resume"] + common)
        summary = json.loads(again.stdout.splitlines()[-1]) if again.returncode == 0 else {}
        check(first is not None and summary.get("steps") == 3 and summary.get("final_loss", 0) is None
              and "nothing left to train" in again.stderr,
              "--resume of a finished run says there is nothing left to train, with no made-up loss")
        resumed = train(["--steps", "5", "--resume", "--lr", "0.05"] + common)
        check(resumed is not None and all(close(r["lr"], 0.05, 1e-6) for r in resumed[0]),
              "--lr given with --resume replaces the checkpoint's lr")
        # Under a schedule --lr is its peak: a requeued job's command line, given again with
        # --resume, continues the schedule where it was, not at the peak.
        scheduled = ["--ranks", "2", "--lr", "0.002", "--lr_schedule", "WarmupDecayLR",
                     "--warmup_steps", "10", "--checkpoint_dir", os.path.join(scratch, "warm")]
        train(["--steps", "5"] + scheduled)
        again = train(["--steps", "9", "--resume"] + scheduled)
        whole = train(["--steps", "9"] + scheduled[:-2])
        check(again is not None and whole is not None
              and [r["lr"] for r in again[0]] == [r["lr"] for r in whole[0][5:]]
              and again[1]["checksum"] == whole[1]["checksum"],
              "--lr and --lr_schedule given again with --resume continue the schedule's lr")
        a_file = os.path.join(scratch, "a_file")
        open(a_file, "w").close()
        check(refused("zero-train", ["--steps", "3", "--checkpoint_dir", a_file, "--resume"],
                      "is not a directory"), "--checkpoint_dir naming a file is refused before any step")
        check(refused("zero-train", ["--steps", "3", "--checkpoint_dir", os.path.join(a_file, "sub")],
                      "cannot be created", "Not a directory"),
              "a --checkpoint_dir that cannot be created is refused before any step, not at the first save")
        check(refused("zero-train", ["--config", scratch], "is a directory"),
              "--config naming a directory says so")
        batch = os.path.join(scratch, "batch.json")
        with open(batch, "w") as f:
            f.write('{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4}')
        sized = run([os.path.join(BIN, "zero-train"), "--steps", "1", "--ranks", "2", "--config", batch])
        check(sized.returncode == 0 and "batch 4/rank" in sized.stdout,
              "a config's train_micro_batch_size_per_gpu sets the batch per rank")
        check(refused("zero-train", ["--ranks", "2", "--config", batch, "--batch", "16"], "--batch 16",
                      "disagrees"), "--batch against a config's micro-batch is refused")
        diverged = run([os.path.join(BIN, "zero-train"), "--json", "--ranks", "1", "--steps", "5",
                        "--optimizer", "sgd", "--lr", "1e6"])
        check(diverged.returncode == 0 and "diverged" in diverged.stderr,
              "a run whose loss is no longer finite says so on stderr (JSON writes inf and nan as null)")
        warmup = os.path.join(scratch, "warmup.json")
        with open(warmup, "w") as f:
            f.write('{"optimizer": {"lr": 0.01}, "scheduler": {"type": "WarmupLR", '
                    '"params": {"warmup_num_steps": 100, "warmup_type": "linear"}}}')
        warmed = train(["--steps", "4", "--ranks", "1", "--config", warmup, "--warmup_steps", "2"])
        check(warmed is not None and close(warmed[0][3]["lr"], 0.01, 1e-6),
              "--warmup_steps sets the warmup of a --config's schedule")


if MODE == "params":
    print_engine_params(sys.argv[3])
    sys.exit(0)
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
    # More buckets than gradient buffers: the branch the forward left out must not hold its
    # bucket (and every later one's buffer) until EndBackward.
    small = ["--branch", "--ranks", "2", "--steps", "4", "--depth", "8", "--width", "64",
             "--reduce_bucket_elems", "4096", "--first_bucket_elems", "4096"]
    branched = {stage: train(small + ["--stage", str(stage)]) for stage in (0, 2, 3)}
    check(all(r is not None for r in branched.values())
          and len({r[1]["checksum"] for r in branched.values()}) == 1,
          "--branch with more buckets than gradient buffers trains alike at stages 0, 2 and 3")
    with tempfile.TemporaryDirectory() as ckpt:  # resumed at a step that skips the branch
        odd = ["--tied", "--branch", "--ranks", "2", "--checkpoint_dir", ckpt]
        train(["--steps", "5"] + odd)
        resumed, whole = train(["--steps", "8", "--resume"] + odd), train(["--steps", "8"] + odd[:-2])
        check(resumed is not None and whole is not None
              and resumed[1]["checksum"] == whole[1]["checksum"],
              "--tied --branch resumed at a step that skips the branch: the count policy learns the "
              "branch where it is first used, and the run equals the uninterrupted one")
    with tempfile.TemporaryDirectory() as ckpt:
        first = train(["--steps", "20", "--precision", "fp16", "--checkpoint_dir", ckpt, "--save_every", "10"])
        resumed = train(["--steps", "40", "--precision", "fp16", "--checkpoint_dir", ckpt, "--resume", "--stage", "3"])
        whole = train(["--steps", "40", "--precision", "fp16"])
        check(first is not None and resumed is not None and whole is not None and len(resumed[0]) == 20
              and (resumed[1]["final_loss"], resumed[1]["checksum"]) == (whole[1]["final_loss"], whole[1]["checksum"]),
              "checkpoint after 20 steps, resume at stage 3 to 40: identical to the uninterrupted run (fp16 scaler included)")
    check_killed_while_saving()
    check_killed_in_its_first_save()
    check_preempted(signal.SIGTERM, flags=["--ranks", "2"])
    check_zero_ckpt()
    check_lr_schedule()
    check_resume_edges()
    check_slurm_example()
    with tempfile.TemporaryDirectory() as root:  # a checkpoint without zero-train's position
        ckpt = os.path.join(root, "ckpt")
        train(["--steps", "2", "--ranks", "2", "--checkpoint_dir", ckpt])
        meta_path = os.path.join(latest(ckpt), "meta.json")
        meta = json.load(open(meta_path))
        meta["user_data"] = "abc"
        json.dump(meta, open(meta_path, "w"))
        check(refused("zero-train", ["--steps", "4", "--ranks", "2", "--checkpoint_dir", ckpt, "--resume"],
                      "meta.json is damaged"),
              "--resume from a checkpoint whose meta.json was edited by hand: its checksum refuses it")
        # The same edit as a checkpoint of format 3 (no checksum, still read) reaches zero-train.
        del meta["checksum"]
        meta["format"] = 3
        json.dump(meta, open(meta_path, "w"))
        check(refused("zero-train", ["--steps", "4", "--ranks", "2", "--checkpoint_dir", ckpt, "--resume"],
                      "cannot resume", '"abc"'),
              "--resume from a checkpoint whose trainer position is not a step is refused, not restarted at 0")
        junk = os.path.join(root, "junk")
        os.makedirs(junk)
        open(os.path.join(junk, "notes.txt"), "w").close()
        check(refused("zero-train", ["--steps", "4", "--ranks", "2", "--checkpoint_dir", junk, "--resume"],
                      "cannot resume", junk), "--resume from a directory holding no checkpoint is refused")
    fp16 = train(["--steps", "40", "--precision", "fp16"])
    check(fp16 is not None and fp16[1]["final_loss"] < fp16[0][0]["loss"], "fp16 with dynamic loss scaling trains")

    estimate = run([os.path.join(BIN, "zero-mem"), "estimate", "--params", "7.5e9", "--ranks", "64"])
    row = next((line for line in estimate.stdout.splitlines() if line.strip().startswith("64")), "")
    check(all(figure in row for figure in ("120.0 GB", "31.4 GB", "16.6 GB", "1.88 GB")),
          "zero-mem estimate reproduces the ZeRO paper's Table 1 row: " + row.strip())
    # DeepSpeed's estimate_zero2_model_states_mem_needs (no offload): 4Ψ + 16Ψ/N = 31.9 GB.
    check("31.9 GB" in row, "zero-mem estimate's DeepSpeed ZeRO-2 column is DeepSpeed's formula: " + row.strip())
    with tempfile.TemporaryDirectory() as scratch:
        png = os.path.join(scratch, "memory.png")
        measure = run([os.path.join(BIN, "zero-mem"), "measure", "--layers", "4", "--width", "256", "--ranks", "1,2",
                       "--csv", "--plot", png])
        rows = [line.split(",") for line in measure.stdout.splitlines()[1:]]
        check(measure.returncode == 0 and len(rows) == 8, "zero-mem measure --csv gives a row per stage 0-3 and rank count")
        check(os.path.exists(png) and os.path.getsize(png) > 1000, "zero-mem --plot draws a PNG with gnuplot")
        quoted = os.path.join(scratch, "it's.svg")
        drawn = run([os.path.join(BIN, "zero-mem"), "estimate", "--params", "1e9", "--ranks", "1,2",
                     "--plot", quoted])
        check(drawn.returncode == 0 and os.path.getsize(quoted) > 1000,
              "zero-mem --plot into a path with a quote in it draws it")
        missing = os.path.join(scratch, "no", "m.png")
        check(refused("zero-mem", ["estimate", "--params", "1e9", "--plot", missing],
                      "cannot create", "No such file"),
              "zero-mem --plot into a missing directory says so (not that gnuplot is missing)")
    check(refused("zero-train", ["4"], 'unexpected argument "4"')
          and refused("zero-mem", ["estimate", "--params", "1e9", "64"],
                      'unexpected argument "64"'),
          "a word no tool expects (a flag's value without its flag) is refused, not ignored")
    # A LoRA job: the frozen base holds only its 2-byte copy, replicated below stage 3 and
    # sharded at stage 3 (7e9 params, 99 % frozen: 0.07e9 × 16 B + 6.93e9 × 2 B = 14.98 GB at
    # 1 rank; stage 3 at 4 ranks a quarter of it).
    lora = run([os.path.join(BIN, "zero-mem"), "estimate", "--params", "7e9", "--frozen_fraction", "0.99",
                "--ranks", "1,4", "--csv"])
    lora_rows = [[float(x) for x in line.split(",")] for line in lora.stdout.splitlines()[1:]]
    check(lora.returncode == 0 and len(lora_rows) == 2 and close(lora_rows[0][1], 14.98e9, 1e-9)
          and close(lora_rows[1][4], 14.98e9 / 4, 1e-9) and close(lora_rows[1][3], 6.93e9 * 2 + 0.07e9 * (2 + 14 / 4), 1e-9),
          "zero-mem estimate --frozen_fraction: frozen params hold their copy only, sharded at stage 3")
    measure = run([os.path.join(BIN, "zero-mem"), "measure", "--layers", "4", "--width", "256", "--lora_rank", "4",
                   "--ranks", "1,2", "--csv"])
    by_stage = {(int(r[0]), int(r[1])): int(r[2]) for r in (line.split(",") for line in measure.stdout.splitlines()[1:])}
    check(measure.returncode == 0 and len(by_stage) == 8 and by_stage[(3, 2)] < 0.6 * by_stage[(2, 2)],
          "zero-mem measure --lora_rank: stage 3 shards the frozen base (params at 2 ranks about half of stage 2's)")
    check(refused("zero-mem", ["estimate", "--params", "1e9", "--frozen_fraction", "1"], "--frozen_fraction 1"),
          "zero-mem estimate --frozen_fraction 1 is refused")
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
    zero_train = os.path.join(BIN, "zero-train")
    mixed = subprocess.run([RUN_MPI, "1", zero_train, "--steps", "3", "--seed", "1", ":", "-np", "1",
                            zero_train, "--steps", "3", "--seed", "2"], capture_output=True, text=True, timeout=120)
    check(mixed.returncode != 0 and "different --seed (rank 0: 1, rank 1: 2)" in mixed.stderr,
          "ranks launched with different --seed (an MPMD line) are refused before any step, naming it")
    check_preempted(signal.SIGUSR1, launcher=(RUN_MPI, "2"))
    check_killed_while_saving(kills=3, launcher=(RUN_MPI, "2"))
    check_rank_failure_ends_the_job()
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
