#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages lowbit builds with, and checks for the CUDA 13 toolkit.
# Silent when everything is present; installs only what is missing. Safe to run repeatedly.
# LOWBIT_SKIP_DEPS=1 skips the package step (for hosts that provide the libraries otherwise).
set -euo pipefail

packages=(cmake g++ make libgtest-dev libcli11-dev nlohmann-json3-dev libfmt-dev libopenblas-dev
  liblzma-dev zlib1g-dev libtomlplusplus-dev clang-format python3)

die() {
  echo "install_deps: $*" >&2
  exit 1
}

install_by_hand() {
  die "$1
  Install these packages by hand, then run make again:
    apt-get install ${missing[*]}"
}

# --- Debian packages -------------------------------------------------------------------------
missing=()
if [[ ${LOWBIT_SKIP_DEPS:-0} != 1 ]]; then
  command -v dpkg-query >/dev/null ||
    die "dpkg-query not found: this script knows Debian/Ubuntu packages only.
  Provide the equivalents of: ${packages[*]}
  and set LOWBIT_SKIP_DEPS=1 to skip this check."
  for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$p")
  done
fi

if ((${#missing[@]} > 0)); then
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || install_by_hand "not root and sudo is not available."
    # Without a terminal a password prompt would hang: fail at once instead.
    if [[ -t 0 ]]; then sudo_cmd=(sudo); else sudo_cmd=(sudo -n); fi
  fi
  command -v apt-get >/dev/null || install_by_hand "apt-get not found."
  echo "install_deps: installing ${missing[*]}" >&2
  "${sudo_cmd[@]}" apt-get update -qq ||
    install_by_hand "'apt-get update' failed (no network, or no permission?)."
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null ||
    install_by_hand "'apt-get install' failed."
  for p in "${missing[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || install_by_hand "$p is still not installed."
  done
fi

# --- CUDA toolkit ----------------------------------------------------------------------------
nvcc=""
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  nvcc=/usr/local/cuda/bin/nvcc
elif command -v nvcc >/dev/null; then
  nvcc=$(command -v nvcc)
fi
cuda_help="lowbit needs the CUDA 13 toolkit (nvcc, cuBLASLt) to build; a GPU is not needed.
  It is usually installed from NVIDIA's apt repository
  (https://developer.nvidia.com/cuda-downloads): install the cuda-keyring package for your
  distribution, then 'apt-get install cuda-toolkit-13-0'. It lands in /usr/local/cuda."
[[ -n $nvcc ]] || die "nvcc not found in /usr/local/cuda/bin or on PATH.
  $cuda_help"
release=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
[[ -n $release && $release -ge 13 ]] ||
  die "$nvcc is CUDA ${release:-of unknown version}, not 13 or newer.
  $cuda_help"
