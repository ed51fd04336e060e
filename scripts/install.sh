#!/usr/bin/env bash
# Install everything slurm-coloc's development and CI need on a fresh Debian 12 machine, idempotently (root):
# Debian's Slurm 22.05 + munge + build tools + the Prometheus server (tests/cluster/test_prometheus.py scrapes the
# samplers with it), and a venv (Debian's python3, so job users can run it) with the package (editable) and its
# dev/gpu extras. Torch comes pinned: torch==2.14.1 torchvision==0.29.1.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${COLOC_VENV:-$REPO/.venv}
[ "$(id -u)" = 0 ] || { echo "install.sh: run as root (apt-get, users, Slurm daemons)" >&2; exit 1; }

# iproute2 (ip netns, veth, bridge) and binutils (nm) for the multi-host test (tests/cluster/test_multihost.py);
# dpkg-deb (package dpkg) and man-db build and check the Debian package (scripts/build_deb.sh).
PKGS="slurmctld slurmd slurm-client libslurm-dev munge python3-venv python3-dev gcc make procps bsdutils util-linux prometheus iproute2 binutils man-db"
missing=""
for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "install.sh: apt-get install$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null   # waits for another apt process's lock
  apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends $missing >/dev/null
fi

# Job users (colocuser) run the venv's python and the examples: every directory above the repo must be
# traversable by them (x only, no read). /root is 0700 on Debian; open it for traversal only when needed.
d=$REPO
while [ "$d" != / ]; do
  perm=$(stat -c %a "$d"); [ $((0$perm & 01)) = 1 ] || { echo "install.sh: chmod o+x $d (job users must reach the repo)"; chmod o+x "$d"; }
  d=$(dirname "$d")
done

[ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV"
# ruff is a binary (no importable module): its presence is checked as a file; yaml-stubs is types-PyYAML's package.
if ! [ -x "$VENV/bin/ruff" ] || ! "$VENV/bin/python" -c "import torch, torchvision, transformers, slurm_coloc, sqlite_utils, prometheus_client, click, rich, yaml, pytest, hypothesis, sklearn, matplotlib, accelerate, lightning, timm, mypy, importlib.util, sys; sys.exit(importlib.util.find_spec('yaml-stubs') is None)" 2>/dev/null; then
  echo "install.sh: pip install into $VENV (torch 2.14.1 is large the first time)"
  log=$(mktemp /tmp/coloc-pip.XXXXXX.log)
  { "$VENV/bin/pip" install -q --upgrade pip &&
    "$VENV/bin/pip" install -q torch==2.14.1 torchvision==0.29.1 &&
    "$VENV/bin/pip" install -q transformers==5.17.0 &&   # paper18 models (zoo_paper.py); as on the GPU machine
    "$VENV/bin/pip" install -q -e "$REPO[dev,gpu]"; } >"$log" 2>&1 ||
    { tail -30 "$log" >&2; echo "install.sh: pip failed (full log: $log)" >&2; exit 1; }
  rm -f "$log"
else
  "$VENV/bin/pip" install -q --no-deps -e "$REPO" >/dev/null 2>&1   # refresh console scripts
fi
chmod -R o+rX "$VENV" "$REPO/examples" 2>/dev/null || true
echo "install.sh: ready ($("$VENV/bin/python" -c 'import torch, slurm_coloc; print("torch", torch.__version__, "slurm-coloc", slurm_coloc.__version__)'); $(slurmd -V))"
