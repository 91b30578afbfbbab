#!/usr/bin/env bash
# Installs the Debian packages diloco's build, tests and demo need, if any
# are missing. Safe to run again: it installs nothing when all are present.
set -euo pipefail

# iproute2: ip and tc, with which bench/wan/run.sh makes its namespaces and shaped links.
packages=(cmake g++ make python3 python3-venv doctest-dev libcli11-dev fortunes libopenmpi-dev openmpi-bin libgloo-dev libhiredis-dev redis-server clang libclang-rt-dev iproute2)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
