#!/usr/bin/env bash
# Installs the Debian packages ZeroRT's build, tests and tools need, when any is missing.
# Idempotent and silent when everything is already there. Nothing comes from outside Debian;
# CUDA, when present, is the toolkit already at /usr/local/cuda.
set -euo pipefail

packages=(
  cmake make g++ pkg-config
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libxxhash-dev
  libopenmpi-dev openmpi-bin
  python3 python3-numpy python3-torch python3-pytest python3-pip python3-setuptools python3-wheel
  gnuplot-nox
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
