"""MPI jobs as a batch system runs them, through mpirun (CTest: python.mpi_jobs, labels
python and mpi; skipped unless ZERO_RUN_MPI names tests/mpi/run_mpi.sh).

A rank that ends with an uncaught exception outside any collective ends the whole job at
once (zerort.mpi_communicator's abort_job_on_exception), instead of leaving its peers to wait
for it: forever where they create a communicator, guard.timeout_s in a step. A rank that ends
without an exception (sys.exit()) tells its peers that it left.
"""
import os
import subprocess
import sys
import time

import pytest

RUN_MPI = os.environ.get("ZERO_RUN_MPI")
RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_job_rank.py")

pytestmark = pytest.mark.skipif(not RUN_MPI, reason="needs ZERO_RUN_MPI (tests/mpi/run_mpi.sh)")


def run_job(ranks, scenario):
    """Runs mpi_job_rank.py SCENARIO on `ranks` ranks: (exit status, output, seconds)."""
    start = time.monotonic()
    job = subprocess.run([RUN_MPI, str(ranks), sys.executable, RANK_SCRIPT, scenario],
                         capture_output=True, text=True, timeout=240)
    return job.returncode, job.stdout + job.stderr, time.monotonic() - start


@pytest.mark.parametrize("scenario", ["fails_before_second_communicator",
                                      "fails_between_steps"])
def test_a_rank_failing_outside_a_collective_ends_the_job_at_once(scenario):
    status, output, seconds = run_job(3, scenario)
    assert status != 0, output
    assert "rank 1 of 3 ends with an uncaught FileNotFoundError" in output, output
    assert "finished" not in output, output
    # The peers wait 300 s in a step (guard.timeout_s) and forever creating a communicator.
    assert seconds < 120, output


def test_a_rank_that_exits_while_its_peers_train_is_named_at_once():
    """sys.exit() ends no MPI job (it is no uncaught exception): the rank's communicator tells
    its peers that it left, and the collective they wait in fails naming it instead of
    waiting guard.timeout_s (300 s). Two ranks: with three (two peers calling MPI_Abort),
    OpenMPI 4.1's mpirun itself hung in PMIx_server_finalize after every rank had ended, in 2
    of about 10 runs under pytest (not reproduced in 48 runs outside it)."""
    status, output, seconds = run_job(2, "exits_between_steps")
    assert status != 0, output
    assert "rank 1 left" in output, output
    assert "finished" not in output, output
    assert seconds < 120, output
