#!/bin/sh
# Common runner for the slurm-coloc hook shims: coloc-hook.sh <hook-name>.
# Runs `coloc-hook <hook-name>` bounded in time; never fails the node or the job (a failing Prolog/Epilog
# drains the node: shared/reference/slurm-22.05-facts.md §5). Python-side errors are logged by coloc-hook
# itself to <log_dir>/hooks.log; this shim only notes crashes and timeouts through logger.
HOOK=${COLOC_HOOK:-/usr/local/bin/coloc-hook}
LIMIT=${COLOC_HOOK_TIMEOUT_S:-30}
# coloc-hook fits its own budget under LIMIT, start-up included (hooks/runner.py work_budget_s). Passed as
# COLOC_SHIM_TIMEOUT_S: COLOC_HOOK_TIMEOUT_S itself would override the config key hook_timeout_s (COLOC_<KEY>).
unset COLOC_HOOK_TIMEOUT_S
COLOC_SHIM_TIMEOUT_S=$LIMIT
export COLOC_SHIM_TIMEOUT_S
if [ "$1" = task-prolog ]; then
  # TaskProlog: stdout carries `export NAME=value` lines to the task; keep it, drop stderr.
  /usr/bin/timeout -k 2 "$LIMIT" "$HOOK" "$1" </dev/null 2>/dev/null
else
  /usr/bin/timeout -k 2 "$LIMIT" "$HOOK" "$1" </dev/null >/dev/null 2>&1
fi
rc=$?
[ $rc = 0 ] || /usr/bin/logger -t "coloc[${SLURM_JOB_ID:-?}]" "$1 hook ended with rc $rc (124: timed out after ${LIMIT}s)" 2>/dev/null
exit 0
