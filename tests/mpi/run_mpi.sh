#!/usr/bin/env bash
# Runs a test binary under OpenMPI's mpirun with N ranks on this one machine:
#   run_mpi.sh N binary [args...]
# Oversubscription is allowed (more ranks than cores), waiting ranks yield their core, root is
# allowed (CI runs as root), and shared-memory transport works inside containers.
set -euo pipefail
ranks=$1
shift
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
export OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
# libnbc's default non-blocking all-reduce is 1.5-3× slower than its Rabenseifner variant here
# (bench/RESULTS.md); keep a caller's own choice.
export OMPI_MCA_coll_libnbc_iallreduce_algorithm=${OMPI_MCA_coll_libnbc_iallreduce_algorithm:-3}
# Every communicator would time the reduce-scatter and all-reduce algorithms when created
# (0.1-0.5 s each, more when oversubscribed); tests create hundreds, so they use the ring and
# the direct all-reduce (our own code, so the engine tests exercise it) unless the caller
# says otherwise. The measured choice ("auto") is tested on purpose in mpi_comm_test.cc.
export ZERO_MPI_REDUCE_SCATTER=${ZERO_MPI_REDUCE_SCATTER:-ring}
export ZERO_MPI_ALL_REDUCE=${ZERO_MPI_ALL_REDUCE:-direct}
exec mpirun -np "$ranks" --oversubscribe --bind-to none "${extra[@]}" "$@"
