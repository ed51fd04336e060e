#!/bin/sh
# Common runner for the slurm-coloc hook shims: coloc-hook.sh <hook-name>.
# Runs `coloc-hook <hook-name>` bounded in time; never fails the node or the job (a failing Prolog/Epilog
# drains the node: docs/facts.md §5). Python-side errors are logged by coloc-hook
# itself to <log_dir>/hooks.log; this shim only notes crashes and timeouts through logger.
# coloc-hook: $COLOC_HOOK, else the Debian package's /usr/bin/coloc-hook, else a manual install's /usr/local/bin.
# The TaskProlog runs in the job's environment, which the user fills (--export): it never takes COLOC_HOOK from
# there, only from its second argument (`task-prolog --hook=/abs/path`, which a site's wrapper may pass; Slurm
# passes the TaskProlog no arguments).
if [ "$1" = task-prolog ]; then
  case ${2:-} in
    --hook=/*) HOOK=${2#--hook=} ;;
    *) HOOK=/usr/bin/coloc-hook; [ -x "$HOOK" ] || HOOK=/usr/local/bin/coloc-hook ;;
  esac
else
  HOOK=${COLOC_HOOK:-/usr/bin/coloc-hook}
  [ -n "${COLOC_HOOK:-}" ] || [ -x "$HOOK" ] || HOOK=/usr/local/bin/coloc-hook
fi
LIMIT=${COLOC_HOOK_TIMEOUT_S:-30}
# Where a run that could not record leaves its environment (slurm_coloc/hooks/pending.py; same default there):
# the next hook run builds its rows from it. Not read from coloc.yaml (no YAML here): set per cluster if needed.
PENDING=${COLOC_PENDING_DIR:-/var/lib/slurm-coloc/pending}
# coloc-hook fits its own budget under LIMIT, start-up included (hooks/runner.py work_budget_s). Passed as
# COLOC_SHIM_TIMEOUT_S: COLOC_HOOK_TIMEOUT_S itself would override the config key hook_timeout_s (COLOC_<KEY>).
unset COLOC_HOOK_TIMEOUT_S
COLOC_SHIM_TIMEOUT_S=$LIMIT
# This run's id (shim pid, uptime): names its pending entry, whether coloc-hook or this shim writes it.
UP0=0.00
read -r UP0 _ 2>/dev/null </proc/uptime
COLOC_SHIM_RUN="$$-$UP0"
export COLOC_SHIM_TIMEOUT_S COLOC_SHIM_RUN
# --preserve-status: rc is coloc-hook's own (0 also when it caught the SIGTERM and recorded or left its pending
# entry itself); 143 (SIGTERM before its handler), 137 (SIGKILL after -k 2) or another rc: it left nothing.
if [ "$1" = task-prolog ]; then
  # TaskProlog runs as the user in the job's own environment, which --export fills: no PYTHON* variable of it may
  # steer the Python that prints the exports (PYTHONPATH=<dir with a slurm_coloc> removed them), nor the user's
  # site-packages, LD_PRELOAD or LD_AUDIT. Variable names only ([A-Za-z0-9_]); a value's own lines unset nothing
  # that exists.
  for v in $(/usr/bin/env | /bin/sed -n 's/^\(PYTHON[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
  unset LD_PRELOAD LD_AUDIT
  PYTHONNOUSERSITE=1
  export PYTHONNOUSERSITE
  # TaskProlog: stdout carries `export NAME=value` lines to the task; keep it, drop stderr.
  /usr/bin/timeout --preserve-status -k 2 "$LIMIT" "$HOOK" "$1" </dev/null 2>/dev/null
else
  /usr/bin/timeout --preserve-status -k 2 "$LIMIT" "$HOOK" "$1" </dev/null >/dev/null 2>&1
fi
rc=$?
if [ $rc != 0 ] && [ "$1" != task-prolog ]; then
  # Keep the environment (NUL-separated, only what the row builder reads) in a root-only directory, atomically.
  UP1=$UP0
  read -r UP1 _ 2>/dev/null </proc/uptime
  case ${SLURM_JOB_ID:-} in ''|*[!0-9]*) job=none ;; *) job=$SLURM_JOB_ID ;; esac
  name="$1-$job-$$-$UP0.env"
  (umask 077; set -C; PATH=/usr/sbin:/usr/bin:/sbin:/bin; export PATH
   [ -e "$PENDING" ] || { (umask 022; mkdir -p "${PENDING%/*}"); mkdir -m 0700 "$PENDING"; }
   [ -d "$PENDING" ] && [ ! -L "$PENDING" ] && [ -O "$PENDING" ] || exit 1
   tmp="$PENDING/.$name.tmp"
   COLOC_PENDING_HOOK=$1 COLOC_PENDING_RC=$rc COLOC_PENDING_TS=$(date +%s.%N) COLOC_PENDING_UP0=$UP0 \
     COLOC_PENDING_UP1=$UP1 /usr/bin/env -0 \
     | grep -z -E '^(SLURMD?_[A-Za-z0-9_]*|SPANK_COLOC_[A-Za-z0-9_]*|USER|COLOC_CONFIG|COLOC_PENDING_[A-Z0-9]*)=' \
     >"$tmp" && mv -f "$tmp" "$PENDING/$name" || { rm -f "$tmp"; exit 1; }
  ) 2>/dev/null || note=", pending entry NOT written"
  /usr/bin/logger -t "coloc[${SLURM_JOB_ID:-?}]" \
    "$1 hook ended with rc $rc (143/137: killed at the shim's ${LIMIT}s limit)${note:-, pending entry $PENDING/$name}" 2>/dev/null
fi
exit 0
