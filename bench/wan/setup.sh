#!/usr/bin/env bash
# bench/wan prerequisites, idempotent: Toxiproxy server (Go), OpenSSH server and sshfs (Debian),
# matplotlib in the project's .venv (the `bench` extra) for the sweep plot.
#   bash bench/wan/setup.sh
# Installs ~/.cache/paramedic/tools/toxiproxy-server (or $PARAMEDIC_TOOLS/toxiproxy-server).
set -euo pipefail

TOOLS="${PARAMEDIC_TOOLS:-$HOME/.cache/paramedic/tools}"
TOXIPROXY_VERSION=v2.5.0
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

mkdir -p "$TOOLS"
# `go install` leaves the version string at "git": a stamp file next to the binary records what was built.
if [ -x "$TOOLS/toxiproxy-server" ] && [ "$(cat "$TOOLS/toxiproxy-server.version" 2>/dev/null)" = "$TOXIPROXY_VERSION" ]; then
  echo "toxiproxy-server $TOXIPROXY_VERSION: present ($TOOLS/toxiproxy-server)"
else
  command -v go >/dev/null || { echo "setup.sh: Go is needed to build Toxiproxy (https://go.dev/dl/)" >&2; exit 1; }
  echo "toxiproxy-server: building $TOXIPROXY_VERSION (~40 s)"
  # `go install` names the binary after its package directory: `server`. Build into a scratch GOBIN.
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  GOBIN="$scratch" go install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION"
  mv "$scratch/server" "$TOOLS/toxiproxy-server"
  echo "$TOXIPROXY_VERSION" > "$TOOLS/toxiproxy-server.version"
fi

missing=()
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v sshfs >/dev/null || missing+=(sshfs)
command -v fusermount >/dev/null || command -v fusermount3 >/dev/null || missing+=(fuse3)
if [ ${#missing[@]} -gt 0 ]; then
  echo "apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
$SUDO mkdir -p /run/sshd
echo "sshd: $(command -v sshd || echo /usr/sbin/sshd); sshfs: $(command -v sshfs)"
[ -e /dev/fuse ] || echo "setup.sh: warning: /dev/fuse is missing; sshfs mounts will fail" >&2

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
if [ -x "$VENV/bin/python" ]; then
  "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null || "$VENV/bin/pip" install -q -e "$ROOT[bench]"
  echo "matplotlib: $("$VENV/bin/python" -c 'import matplotlib; print(matplotlib.__version__)')"
else
  echo "setup.sh: no $VENV yet (run \`make setup\`); the plot needs matplotlib there" >&2
fi
