#!/usr/bin/env bash
# Installs the build into a scratch prefix, builds examples/cpp against it with
# find_package(ZeroRT), and runs the example: what a user embedding ZeroRT does. Then imports
# the installed Python package, which must find the installed library.
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
# The Python package from the same prefix, finding the installed library by itself.
if [ -x /usr/bin/python3 ]; then
  (cd "$scratch" && PYTHONPATH="$scratch/prefix/lib/python3/dist-packages" /usr/bin/python3 -c \
    "import zerort; print('installed python package:', zerort.version())")
fi
