#!/usr/bin/env bash
# Runs a libFuzzer target for CTest (tests/fuzz/CMakeLists.txt):
#   run_fuzz.sh replay BINARY REGRESSIONS_DIR
#       runs every file of REGRESSIONS_DIR (but a README) through BINARY once; fails when any
#       crashes, after running them all
#   run_fuzz.sh fuzz BINARY SECONDS SEED_DIR DICT WORK_DIR ARTIFACT_DIR
#       fuzzes for SECONDS from SEED_DIR (read only) and WORK_DIR (where new inputs go); a
#       crashing input is written to ARTIFACT_DIR and the run fails
# Inputs are bounded (-max_len 64 KiB), a single input may take 10 s (-timeout) and the process
# 2 GiB (-rss_limit_mb; libFuzzer's -malloc_limit_mb defaults to the same: one allocation of
# more than that, e.g. a size read from a file and trusted, is a crash).
set -euo pipefail
mode=$1
binary=$2
case "$mode" in
  replay)
    dir=$3
    shopt -s nullglob
    inputs=()
    for f in "$dir"/*; do  # every regular file but a README
      [ -f "$f" ] && [[ "$(basename "$f")" != README* ]] && inputs+=("$f")
    done
    if [ ${#inputs[@]} -eq 0 ]; then
      echo "no reproducers in $dir"
      exit 0
    fi
    status=0
    for f in "${inputs[@]}"; do
      if "$binary" -runs=1 "$f" >"${TMPDIR:-/tmp}/zero-fuzz-replay.$$" 2>&1; then
        echo "ok    $(basename "$f")"
      else
        echo "CRASH $(basename "$f")"
        tail -n 40 "${TMPDIR:-/tmp}/zero-fuzz-replay.$$"
        status=1
      fi
    done
    rm -f "${TMPDIR:-/tmp}/zero-fuzz-replay.$$"
    exit $status
    ;;
  fuzz)
    seconds=$3 seeds=$4 dict=$5 work=$6 artifacts=$7
    mkdir -p "$work" "$artifacts"
    exec "$binary" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -dict="$dict" -artifact_prefix="$artifacts/" "$work" "$seeds"
    ;;
  *)
    echo "usage: run_fuzz.sh replay BINARY DIR | fuzz BINARY SECONDS SEEDS DICT WORK ARTIFACTS" >&2
    exit 2
    ;;
esac
