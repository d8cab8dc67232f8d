#!/usr/bin/env bash
# Installs the Debian packages leantune builds against, only those missing. Idempotent.
set -euo pipefail
pkgs=(cmake make g++ pkg-config googletest libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev libopenblas-openmp-dev libpcre2-dev libutf8proc-dev libcli11-dev libfmt-dev
      libyaml-dev
      libopenmpi-dev openmpi-bin
      chromium)  # headless browser of the memviz page test (tests/cli/memviz.sh)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup: installing missing packages: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo="sudo"
else
  echo "setup: missing packages (${missing[*]}) and not root; run as root:" >&2
  echo "  apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
