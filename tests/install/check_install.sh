#!/usr/bin/env bash
# Installs the build into a scratch prefix, builds examples/cpp against it with
# find_package(ZeroRT), and runs the example: what a user embedding ZeroRT does.
#   check_install.sh <build dir> <source dir>
set -euo pipefail
build=$1
source=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
cmake -S "$source/examples/cpp" -B "$scratch/example" -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/example" -j 2 >/dev/null
LD_LIBRARY_PATH="$scratch/prefix/lib" "$scratch/example/train"
