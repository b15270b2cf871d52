#!/usr/bin/env python3
"""The fine-tuning example as a user runs it: the ZeroRT loop adds at most 20 lines to the
plain-PyTorch one; the plain loop runs; the ZeroRT loop runs under torchrun on 2 ranks, saves,
and resumes under mpirun on 3 ranks; the loss falls in both.

    check_finetune.py RUN_MPI_SH WORK_DIR
"""
import difflib
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "pytorch", "finetune")


def added_lines():
    """Lines the ZeroRT loop adds to (or changes in) the plain PyTorch loop."""
    with open(os.path.join(EXAMPLE, "finetune_torch.py")) as f:
        plain = f.readlines()
    with open(os.path.join(EXAMPLE, "finetune_zerort.py")) as f:
        ported = f.readlines()
    return [line for line in difflib.unified_diff(plain, ported, n=0)
            if line.startswith("+") and not line.startswith("+++")]


def losses(output):
    """The training losses the loop printed."""
    return [float(x) for x in re.findall(r"loss (\d+\.\d+)", output)]


def run(command, cwd):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        sys.exit(f"FAILED: {' '.join(command)}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def main():
    run_mpi, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    added = added_lines()
    if len(added) > 20:
        sys.exit(f"FAILED: the ZeroRT loop adds {len(added)} lines (> 20):\n" + "".join(added))
    plain = run([sys.executable, os.path.join(EXAMPLE, "finetune_torch.py"), "--steps", "41",
                 "--checkpoint", os.path.join(work, "torch")], work)
    # torchrun's default "--redirects 0" breaks on Debian's torch 1.13 under Python 3.12.
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", "--redirects", "2", "--tee", "2"]
    zerort = run(torchrun + [os.path.join(EXAMPLE, "finetune_zerort.py"), "--steps", "21",
                             "--checkpoint", os.path.join(work, "zerort")], work)
    resumed = run([run_mpi, "3", sys.executable, os.path.join(EXAMPLE, "finetune_zerort.py"),
                   "--steps", "41", "--resume", "--checkpoint", os.path.join(work, "zerort")], work)
    for name, output in (("plain", plain), ("zerort", zerort + resumed)):
        seen = losses(output)
        if len(seen) < 3 or not seen[-1] < seen[0] - 0.3:
            sys.exit(f"FAILED: the {name} loop's loss did not fall: {seen}\n{output}")
    print(f"the port adds {len(added)} lines; losses: plain {losses(plain)}, "
          f"zerort {losses(zerort + resumed)}")


if __name__ == "__main__":
    main()
