#!/usr/bin/env bash
# A real local Slurm cluster for slurm-coloc: munged, slurmctld and two slurmd (n1, n2) on this host,
# each node with 2 fake GPUs (char devices 195,N) and 80 shards per GPU (1 shard = 1 GiB of an 80 GiB GPU).
# Prolog, Epilog, PrologSlurmctld, EpilogSlurmctld and TaskProlog run the project's hooks in prolog_epilog/.
#
# Usage: scripts/cluster.sh start|stop|status|env
#   COLOC_CLUSTER_DIR  where config, state, logs and fake devices live   (default /tmp/coloc-cluster)
#   COLOC_PORT_BASE    slurmctld port; slurmd n1/n2 use +1/+2             (default 17000)
#   COLOC_GPU_MEM_GIB  configured memory per fake GPU = shards per GPU     (default 80)
#   COLOC_PLUGSTACK    optional plugstack.conf to enable (SPANK plugin)
#   COLOC_VENV         python venv whose bin/ holds coloc-hook            (default <repo>/.venv)
#   COLOC_SLURM        Slurm version: 22.05 (Debian 12's, from apt), 24.11 or 26.05 (fetched and run through their
#                      own loader by scripts/slurm_versions.sh)   (default: the newest that works here)
# `env` also prints COLOC_SLURM and COLOC_SLURM_BIN (the client commands of the cluster's version; put it first on
# PATH). The version a cluster was started with is kept in <dir>/etc/slurm_version; stop/status use it.
# Each cluster runs its own munged (socket, pid, log and seed under <dir>/munge, the host's /etc/munge/munge.key;
# slurm.conf's AuthInfo names the socket), so clusters started side by side never share or stop each other's.
# Start is idempotent (a running cluster is left alone); stop leaves no daemon of this cluster behind, its munged
# included, and touches no other. Needs root. Facts: docs/facts.md.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE=${COLOC_CLUSTER_DIR:-/tmp/coloc-cluster}
PORT=${COLOC_PORT_BASE:-17000}
GPU_GIB=${COLOC_GPU_MEM_GIB:-80}
VENV=${COLOC_VENV:-$REPO/.venv}
CONF=$BASE/etc/slurm.conf
MUNGE_DIR=$BASE/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket.2
MUNGE_KEY=/etc/munge/munge.key
HOST=$(hostname -s)
export SLURM_CONF=$CONF
VERSIONS=$REPO/scripts/slurm_versions.sh

die() { echo "cluster.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (slurmd and munged need it)"

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# shellcheck source=lib/slurm_conf.sh
. "$REPO/scripts/lib/slurm_conf.sh"   # ensure_users, slurm_conf_*: shared with benchmarks/device/cluster_gpu.sh

# select_version [fetch]: SLURM_VERSION, SLURM_BIN, SLURM_SBIN, SLURM_PLUGIN_DIR, ... of this cluster: the version
# it was started with, else COLOC_SLURM, else the newest that works (fetched when "fetch" is given).
select_version() {
  local v=${COLOC_SLURM:-}
  [ -f "$BASE/etc/slurm_version" ] && v=$(cat "$BASE/etc/slurm_version")
  if [ -z "$v" ]; then
    if [ "${1:-}" = fetch ]; then v=$("$VERSIONS" newest); else v=22.05; fi
  fi
  if [ "${1:-}" = fetch ]; then "$VERSIONS" fetch "$v" >/dev/null || die "Slurm $v is not available here"; fi
  local assignments
  assignments=$("$VERSIONS" env "$v") || die "Slurm $v is not fetched (scripts/slurm_versions.sh fetch $v)"
  eval "$assignments"
}

# ensure_munge_key: the host's munge key, created where missing (atomically: clusters may start side by side).
ensure_munge_key() {
  [ -f "$MUNGE_KEY" ] && return 0
  local tmp
  install -d -o munge -g munge -m 0700 "$(dirname "$MUNGE_KEY")"
  tmp=$(dirname "$MUNGE_KEY")/.munge.key.$$
  mungekey --create --keyfile="$tmp" 2>/dev/null || dd if=/dev/urandom of="$tmp" bs=1 count=1024 2>/dev/null
  chown munge:munge "$tmp"; chmod 0400 "$tmp"
  mv -n "$tmp" "$MUNGE_KEY"; rm -f "$tmp"
}

# ensure_munge: this cluster's own munged (socket <dir>/munge/munge.socket.2), started unless it answers.
ensure_munge() {
  command -v munged >/dev/null || die "munge is not installed (apt-get install munge)"
  if ! munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; then
    ensure_munge_key
    install -d -o munge -g munge -m 0755 "$MUNGE_DIR"   # munged wants its socket directory executable by all
    runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" \
      --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" \
      || die "munged did not start (see $MUNGE_DIR/munged.log)"
    for _ in $(seq 50); do
      munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1 && return 0
      sleep 0.1
    done
    die "munged did not come up (see $MUNGE_DIR/munged.log)"
  fi
}

write_config() {
  install -d -m 0755 "$BASE" "$BASE/etc" "$BASE/etc/hooks" "$BASE/log" "$BASE/state" "$BASE/spool" "$BASE/run"
  install -d -m 0755 "$BASE/coloc"   # root-owned, readable: TaskProlog (as the user) reads run_dir/jobs/*.env
  install -d -m 0777 "$BASE/jobs"; chmod +t "$BASE/jobs"
  local n i
  for n in n1 n2; do
    install -d -m 0755 "$BASE/dev/$n" "$BASE/spool/$n"
    for i in 0 1; do [ -c "$BASE/dev/$n/nvidia$i" ] || mknod "$BASE/dev/$n/nvidia$i" c 195 "$i"; done
  done
  slurm_conf_hooks "$BASE/etc/hooks" "$BASE/etc/coloc.yaml" "$CONF" "$VENV/bin/coloc-hook" "$REPO/prolog_epilog" \
    "# Generated by scripts/cluster.sh: hand the project's shim this cluster's config (hooks get no PATH/SLURM_CONF)."
  { echo "# Generated by slurm-coloc scripts/cluster.sh (test/demo cluster; production: docs/admin.md)"
    slurm_conf_common coloc "$HOST" "$PORT" "cred_expire=10,socket=$MUNGE_SOCKET" "$SLURM_PLUGIN_DIR" "$BASE" 2 "$SLURM_VERSION"
    if [ -n "${COLOC_PLUGSTACK:-}" ]; then echo "PlugStackConfig=$COLOC_PLUGSTACK"; fi
    for n in n1 n2; do slurm_conf_node $n "$HOST" $((PORT + ${n#n})) 32 2 $((GPU_GIB * 2)); done
    slurm_conf_partition
  } > "$CONF"
  { echo "AutoDetect=off"
    for n in n1 n2; do slurm_conf_gres $n 2 "$GPU_GIB" "$BASE/dev/$n/nvidia"; done
  } > "$BASE/etc/gres.conf"
  if [ -f "$BASE/etc/coloc.yaml" ]; then   # kept (tests add keys); its Slurm is the version started now
    sed -i "s|^slurm_bin_dir: .*|slurm_bin_dir: $SLURM_BIN|" "$BASE/etc/coloc.yaml"
  else
    slurm_conf_coloc_yaml "slurm-coloc config of the local cluster (all keys: docs/admin.md)" "$BASE" "$SLURM_BIN" "$GPU_GIB" \
      > "$BASE/etc/coloc.yaml"
  fi
}

wait_nodes() {
  local state
  for _ in $(seq 150); do
    state=$("$SLURM_BIN/sinfo" -h -N -o '%N %t' 2>/dev/null | sort -u | tr '\n' ' ') || true
    case "$state" in *"n1 idle"*"n2 idle"*|*"n1 mix"*"n2 idle"*|*"n1 idle"*"n2 mix"*|*"n1 mix"*"n2 mix"*) return 0;; esac
    sleep 0.2
  done
  die "nodes did not become idle: ${state:-no answer from slurmctld} (see $BASE/log/)"
}

start_reader() {   # coloc-report serve: answers users' coloc-report (the databases are root/admin-group only)
  pid_alive "$BASE/run/coloc-report.pid" && return 0
  setsid "$VENV/bin/coloc-report" serve --config "$BASE/etc/coloc.yaml" --pidfile "$BASE/run/coloc-report.pid" \
    </dev/null >>"$BASE/log/report-serve.log" 2>&1 &
  for _ in $(seq 100); do pid_alive "$BASE/run/coloc-report.pid" && return 0; sleep 0.1; done
  die "coloc-report serve did not start (see $BASE/log/report-serve.log)"
}

start() {
  command -v munged >/dev/null || die "munge is not installed (scripts/install.sh)"
  [ -x "$VENV/bin/coloc-hook" ] || die "no coloc-hook in $VENV (run scripts/install.sh first)"
  if [ -f "$BASE/etc/slurm_version" ] && [ -n "${COLOC_SLURM:-}" ] && [ "$(cat "$BASE/etc/slurm_version")" != "$COLOC_SLURM" ]; then
    pid_alive "$BASE/run/slurmctld.pid" && die "$BASE runs Slurm $(cat "$BASE/etc/slurm_version"), not $COLOC_SLURM: stop it first"
    rm -f "$BASE/etc/slurm_version"
  fi
  select_version fetch
  [ -x "$SLURM_SBIN/slurmctld" ] || die "Slurm $SLURM_VERSION is not installed (scripts/install.sh)"
  ensure_users; ensure_munge; write_config
  # slurmctld refuses another release's saved state ("Can not recover ... incompatible version"): a directory
  # last used by another version starts with empty state and spool (its jobs are gone with it).
  if [ "$(cat "$BASE/state/.slurm_version" 2>/dev/null || echo 22.05)" != "$SLURM_VERSION" ] && ! pid_alive "$BASE/run/slurmctld.pid"; then
    find "$BASE/state" "$BASE/spool" -mindepth 1 -maxdepth 2 ! -name 'n[12]' -exec rm -rf {} + 2>/dev/null || true
  fi
  echo "$SLURM_VERSION" > "$BASE/state/.slurm_version"
  echo "$SLURM_VERSION" > "$BASE/etc/slurm_version"
  pid_alive "$BASE/run/slurmctld.pid" || "$SLURM_SBIN/slurmctld" -f "$CONF"
  local n
  for n in n1 n2; do pid_alive "$BASE/run/slurmd-$n.pid" || "$SLURM_SBIN/slurmd" -f "$CONF" -N "$n"; done
  wait_nodes
  start_reader
  echo "cluster up: Slurm $SLURM_VERSION, SLURM_CONF=$CONF ($("$SLURM_BIN/sinfo" -h -o '%D nodes %G' | head -1))"
}

stop() {
  select_version
  if pid_alive "$BASE/run/slurmctld.pid"; then
    "$SLURM_BIN/scancel" --quiet --full $("$SLURM_BIN/squeue" -h -o %i 2>/dev/null) 2>/dev/null || true
  fi
  local f pids=""
  for f in "$BASE"/run/slurmd-*.pid "$BASE/run/slurmctld.pid" "$BASE/run/coloc-report.pid"; do
    pid_alive "$f" && { pids="$pids $(cat "$f")"; kill -TERM "$(cat "$f")" 2>/dev/null || true; }
  done
  for _ in $(seq 100); do
    local alive=""
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break; sleep 0.1
  done
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  rm -f "$BASE"/run/*.pid
  # the daemons are gone: now this cluster's munged (by its pid file; another cluster's munged is never touched)
  if pid_alive "$MUNGE_DIR/munged.pid"; then
    local m
    m=$(cat "$MUNGE_DIR/munged.pid")
    kill -TERM "$m" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$m" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$m" 2>/dev/null || true
  fi
  echo "cluster stopped ($BASE)"
}

status() {
  select_version
  local f ok=0
  for f in "$BASE/run/slurmctld.pid" "$BASE/run/slurmd-n1.pid" "$BASE/run/slurmd-n2.pid"; do
    if pid_alive "$f"; then echo "$(basename "$f" .pid): running ($(cat "$f"))"; else echo "$(basename "$f" .pid): stopped"; ok=1; fi
  done
  echo "Slurm $SLURM_VERSION"
  [ $ok = 0 ] && "$SLURM_BIN/sinfo" -N -o '%N %t %G' || true
  return $ok
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) select_version
       echo "export SLURM_CONF=$CONF COLOC_CONFIG=$BASE/etc/coloc.yaml COLOC_SLURM=$SLURM_VERSION COLOC_SLURM_BIN=$SLURM_BIN" ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
