#!/usr/bin/env bash
# Start (idempotently) a one-node real Slurm 22.05.8 cluster over this machine's GPUs from the carried bundle:
# munged, slurmctld, slurmd "n1" with Gres=gpu:N,shard:N*G (1 shard = 1 GiB; G = GiB of one GPU), the project's
# Prolog/Epilog/PrologSlurmctld/EpilogSlurmctld/TaskProlog (prolog_epilog/*.sh -> coloc-hook), MPS started by the
# Prolog, coloc-sampler autostarted by the Prolog. The same code paths as production; nothing stubbed.
#
# Usage (root):  benchmarks/device/cluster_gpu.sh start|stop|env
#   COLOC_BENCH_ROOT    install/run folder (default /opt/coloc; must be readable by job users)
#   COLOC_BENCH_PYTHON  a Python with torch + nvidia-ml-py (default /opt/torch/.venv/bin/python3)
#   COLOC_BENCH_BUNDLE  the Slurm bundle (default <repo>/.carry/slurm-bundle.tar.gz, from build_bundle.sh; its
#                       bundle.env names the Slurm version: 22.05 runs through the machine's loader with the
#                       bundle's libraries, 24.11/26.05 are patched to their own glibc and run directly)
#   COLOC_BENCH_FAKE_GPUS=N  CPU-only test here: N fake GPUs (char devices 195,N) of COLOC_BENCH_GPU_GIB GiB
#   COLOC_BENCH_PORT    slurmctld port, slurmd uses +1 (default 17600)
# Facts: docs/facts.md §13 (Slurm on the GPU test machine) and §1-§9.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROOT=${COLOC_BENCH_ROOT:-/opt/coloc}
PY=${COLOC_BENCH_PYTHON:-/opt/torch/.venv/bin/python3}
BUNDLE=${COLOC_BENCH_BUNDLE:-$REPO/.carry/slurm-bundle.tar.gz}
PORT=${COLOC_BENCH_PORT:-17600}
S=$ROOT/slurm                      # unpacked bundle
LIBS=$S/bundle-lib:$S/usr/lib/x86_64-linux-gnu/slurm-wlm:$S/usr/lib/x86_64-linux-gnu
LDSO=/lib64/ld-linux-x86-64.so.2
CONF=$ROOT/etc/slurm.conf
HOST=$(hostname -s 2>/dev/null || cut -d. -f1 /proc/sys/kernel/hostname)
die() { echo "cluster_gpu.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"
pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# shellcheck source=../../scripts/lib/slurm_conf.sh
. "$REPO/scripts/lib/slurm_conf.sh"   # ensure_users, slurm_conf_*: shared with scripts/cluster.sh

# run_prefix: what precedes a bundled program: the machine's loader with the bundle's libraries (22.05), or
# nothing (newer releases: patched to their own loader and libraries).
run_prefix() {
  if grep -qs LAYOUT=patched "$S/bundle.env"; then echo ""; else echo "$LDSO --library-path $LIBS"; fi
}

unpack() {
  [ -f "$BUNDLE" ] || die "no bundle at $BUNDLE (run benchmarks/device/build_bundle.sh here first)"
  if [ -x "$S/usr/sbin/slurmctld" ] && ! tar -xzOf "$BUNDLE" ./bundle.env 2>/dev/null | cmp -s - "$S/bundle.env"; then
    rm -rf "$S"   # another version's bundle
  fi
  if [ ! -x "$S/usr/sbin/slurmctld" ]; then mkdir -p "$S"; tar -C "$S" -xzf "$BUNDLE"; fi
  local run; run=$(run_prefix)
  # spool/n1: SlurmdSpoolDir (22.05's slurmd creates it; 26.05's does not, and its slurmstepd then cannot open
  # its socket there: "Can not read return code from slurmstepd").
  install -d -m 0755 "$ROOT" "$ROOT/bin" "$ROOT/etc" "$ROOT/log" "$ROOT/state" "$ROOT/spool" "$ROOT/spool/n1" \
    "$ROOT/run" "$ROOT/coloc" "$ROOT/munge-run"
  install -d -m 0700 "$ROOT/munge-key"
  install -d -m 1777 "$ROOT/jobs"
  # Client commands through the dynamic loader with the bundle's library path: nothing of the bundle leaks into
  # the environment that sbatch hands to jobs (torch must load the machine's own libraries).
  local p arg0
  for p in sbatch scontrol squeue sinfo scancel srun salloc sacct sstat sprio; do
    if [ -n "$run" ]; then arg0="--argv0 $p"; else arg0=""; fi
    printf '#!/bin/sh\nexec %s %s %s "$@"\n' "$run" "$arg0" "$S/usr/bin/$p" > "$ROOT/bin/$p"
  done
  for p in munge unmunge; do
    if [ -n "$run" ]; then arg0="--argv0 $p"; else arg0=""; fi
    printf '#!/bin/sh\nexec %s %s %s --socket=%s "$@"\n' "$run" "$arg0" "$S/usr/bin/$p" \
      "$ROOT/munge-run/munge.socket.2" > "$ROOT/bin/$p"
  done
  chmod 0755 "$ROOT"/bin/*
  # Root-side programs (the Prolog's MPS daemon, the sampler's NVML) get no LD_LIBRARY_PATH: where the driver's
  # libraries are only on the machine's LD_LIBRARY_PATH (/usr/local/nvidia/lib64), tell the loader cache.
  if ! ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml.so.1' && [ -e /usr/local/nvidia/lib64/libnvidia-ml.so.1 ]; then
    echo /usr/local/nvidia/lib64 > /etc/ld.so.conf.d/coloc-bench-nvidia.conf; ldconfig
    echo "cluster_gpu: added /usr/local/nvidia/lib64 to the loader cache (libcuda/libnvidia-ml for root-side programs)"
  fi
  # slurmd always runs /usr/sbin/slurmstepd (built-in path). Only where the machine has none (the GPU machine)
  # put a wrapper there; a host with Debian's Slurm (here) keeps its own.
  # slurmstepd runs as a program of its own (LD_LIBRARY_PATH, not the loader as a command): its process title
  # then reads `slurmstepd: [<job>.<step>]` from the start of /proc/<pid>/cmdline, which the sampler's
  # attribution needs on this cgroup-less machine (node/attribution.py rule 2; docs/reliability.md). Jobs do not
  # inherit it: slurmstepd builds their environment from the job's own.
  if [ ! -e /usr/sbin/slurmstepd ] || grep -q coloc-bench /usr/sbin/slurmstepd 2>/dev/null; then
    if [ -n "$run" ]; then pre="LD_LIBRARY_PATH=$LIBS"; else pre=""; fi
    printf '#!/bin/sh\n# coloc-bench wrapper\nexec env %s %s "$@"\n' "$pre" "$S/usr/sbin/slurmstepd" > /usr/sbin/slurmstepd
    chmod 0755 /usr/sbin/slurmstepd
  fi
}

python_env() {  # $ROOT/venv: $PY's packages + carried wheels + the project, readable by job users
  rm -rf "$ROOT/src"; install -d -m 0755 "$ROOT/src" "$ROOT/src/benchmarks" "$ROOT/site"
  cp -r "$REPO/slurm_coloc" "$REPO/prolog_epilog" "$REPO/pyproject.toml" "$ROOT/src/"
  cp -r "$REPO/benchmarks/device" "$ROOT/src/benchmarks/"
  cp "$REPO/benchmarks/__init__.py" "$ROOT/src/benchmarks/"   # the package: python3 -m benchmarks.device.<x>
  [ -d "$REPO/examples" ] && cp -r "$REPO/examples" "$ROOT/src/"
  find "$ROOT/src" -name __pycache__ -prune -exec rm -rf {} +
  local w
  for w in "$REPO"/.carry/whl/*.whl; do [ -f "$w" ] && "$PY" -m zipfile -e "$w" "$ROOT/site"; done
  [ -x "$ROOT/venv/bin/python3" ] || "$PY" -m venv --without-pip "$ROOT/venv"
  local sp base
  sp=$("$ROOT/venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  base=$("$PY" -c 'import site; print("\n".join(site.getsitepackages()))')
  printf '%s\n%s\n%s\n' "$ROOT/src" "$ROOT/site" "$base" > "$sp/coloc-bench.pth"
  # Console scripts of pyproject.toml's [project.scripts] (coloc-sbatch, coloc-hook, ... , coloc-replay); read by
  # line, as the harness's Python may be older than tomllib (3.11).
  "$ROOT/venv/bin/python3" - "$ROOT/src/pyproject.toml" "$ROOT/venv/bin" <<'PYEOF'
import os, sys
section = ""
entries = []
for line in open(sys.argv[1]):
    if line.startswith("["):
        section = line.strip()
    elif section == "[project.scripts]" and "=" in line:
        entries.append([x.strip().strip('"') for x in line.split("=", 1)])
for name, target in entries:
    mod, func = target.split(":")
    path = os.path.join(sys.argv[2], name)
    with open(path, "w") as fh:
        fh.write(f"#!{sys.argv[2]}/python3\nimport sys\nfrom {mod} import {func}\nsys.exit({func}())\n")
    os.chmod(path, 0o755)
PYEOF
  chmod -R a+rX "$ROOT/src" "$ROOT/site" "$ROOT/venv"
  "$ROOT/venv/bin/python3" -c 'import slurm_coloc, sqlite_utils, click, rich, yaml' || die "python env broken"
}

gpu_files() {  # prints "<count> <GiB per GPU> <file-glob>"
  if [ -n "${COLOC_BENCH_FAKE_GPUS:-}" ]; then
    local i; install -d -m 0755 "$ROOT/dev"
    for i in $(seq 0 $((COLOC_BENCH_FAKE_GPUS - 1))); do [ -c "$ROOT/dev/nvidia$i" ] || mknod "$ROOT/dev/nvidia$i" c 195 "$i"; done
    echo "$COLOC_BENCH_FAKE_GPUS ${COLOC_BENCH_GPU_GIB:-80} $ROOT/dev/nvidia"
  else
    local n mib
    n=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
    # COLOC_BENCH_GPUS=k: a cluster of the first k GPUs only (a one-GPU pass on a two-GPU machine)
    if [ -n "${COLOC_BENCH_GPUS:-}" ] && [ "$COLOC_BENCH_GPUS" -lt "$n" ]; then n=$COLOC_BENCH_GPUS; fi
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' ')
    echo "$n $((mib / 1024)) /dev/nvidia"
  fi
}

write_config() {
  read -r NGPU GIB DEVPFX < <(gpu_files)
  [ "$NGPU" -ge 1 ] || die "no GPU found"
  install -d -m 0755 "$ROOT/etc/hooks"
  slurm_conf_hooks "$ROOT/etc/hooks" "$ROOT/etc/coloc.yaml" "$CONF" "$ROOT/venv/bin/coloc-hook" "$ROOT/src/prolog_epilog"
  { echo "# Generated by benchmarks/device/cluster_gpu.sh (slurm-coloc device harness)"
    slurm_conf_common colocdev "$HOST" "$PORT" "socket=$ROOT/munge-run/munge.socket.2,cred_expire=10" \
      "$S/usr/lib/x86_64-linux-gnu/slurm-wlm" "$ROOT" 1 "$(sed -n 's/.*SLURM_VERSION=\([0-9.]*\).*/\1/p' "$S/bundle.env" 2>/dev/null || echo 22.05)"
    slurm_conf_node n1 "$HOST" $((PORT + 1)) $(( $(nproc) > 32 ? $(nproc) : 32 )) "$NGPU" $((NGPU * GIB))
    slurm_conf_partition
  } > "$CONF"
  # 22.05: cgroup/v1 (its v2 plugin wants systemd/dbus at start; the GPU machine has cgroup2 and no systemd).
  # 24.11+: no cgroup plugin at all (CgroupPlugin=disabled, new in 23.x): proctrack/linuxproc and task/none use
  # none, and 26.05's cgroup/v1 is deprecated.
  if grep -qs LAYOUT=patched "$S/bundle.env"; then echo "CgroupPlugin=disabled"; else echo "CgroupPlugin=cgroup/v1"; fi \
    > "$ROOT/etc/cgroup.conf"
  { echo "AutoDetect=off"; slurm_conf_gres n1 "$NGPU" "$GIB" "$DEVPFX"; } > "$ROOT/etc/gres.conf"
  { slurm_conf_coloc_yaml "slurm-coloc config of the device harness" "$ROOT" "$ROOT/bin" "$GIB"
    echo "sampler_interval_s: 0.5"
    echo "sampler_batch_s: 2"
  } > "$ROOT/etc/coloc.yaml"
  chmod a+r "$ROOT"/etc/*
}

start() {
  unpack; python_env; ensure_users; write_config
  # 22.05's daemons find the bundle's libraries through LD_LIBRARY_PATH; patched releases need none (DT_RPATH).
  local env=""
  [ -z "$(run_prefix)" ] || env="LD_LIBRARY_PATH=$LIBS"
  if ! pid_alive "$ROOT/run/munged.pid"; then
    [ -f "$ROOT/munge-key/munge.key" ] || env $env "$S/usr/sbin/mungekey" --create --keyfile="$ROOT/munge-key/munge.key"
    env $env "$S/usr/sbin/munged" --socket="$ROOT/munge-run/munge.socket.2" --key-file="$ROOT/munge-key/munge.key" \
      --pid-file="$ROOT/run/munged.pid" --log-file="$ROOT/log/munged.log" --seed-file="$ROOT/munge-key/seed" --force
  fi
  "$ROOT/bin/munge" -n | "$ROOT/bin/unmunge" >/dev/null || die "munge does not work (see $ROOT/log/munged.log)"
  export SLURM_CONF=$CONF
  pid_alive "$ROOT/run/slurmctld.pid" || env $env "$S/usr/sbin/slurmctld" -f "$CONF"
  pid_alive "$ROOT/run/slurmd-n1.pid" || env $env "$S/usr/sbin/slurmd" -f "$CONF" -N n1
  local state=""
  for _ in $(seq 150); do
    state=$("$ROOT/bin/sinfo" -h -N -o '%N %t' 2>/dev/null || true)
    case "$state" in "n1 idle"*|"n1 mix"*) break ;; esac; sleep 0.2
  done
  case "$state" in "n1 idle"*|"n1 mix"*) ;; *) tail -20 "$ROOT"/log/slurm*.log >&2; die "node not idle: '$state'" ;; esac
  echo "cluster_gpu: up: $("$ROOT/bin/sinfo" -h -o '%N %G') ($NGPU GPU(s) x $GIB GiB); SLURM_CONF=$CONF"
}

stop() {
  export SLURM_CONF=$CONF
  pid_alive "$ROOT/run/slurmctld.pid" && { "$ROOT/bin/scancel" --quiet --full $("$ROOT/bin/squeue" -h -o %i 2>/dev/null) 2>/dev/null || true; }
  local f
  for f in "$ROOT/run/slurmd-n1.pid" "$ROOT/run/slurmctld.pid" "$ROOT/run/munged.pid"; do
    if pid_alive "$f"; then kill -TERM "$(cat "$f")"; for _ in $(seq 50); do pid_alive "$f" || break; sleep 0.1; done; fi
    rm -f "$f"
  done
  echo "cluster_gpu: stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) echo "export SLURM_CONF=$CONF COLOC_CONFIG=$ROOT/etc/coloc.yaml PATH=$ROOT/venv/bin:$ROOT/bin:\$PATH" ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
