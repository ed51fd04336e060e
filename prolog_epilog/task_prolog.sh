#!/bin/sh
# Slurm task_prolog shim for slurm-coloc (slurm.conf: see docs/admin.md). Always exits 0.
# coloc-hook is /usr/bin/coloc-hook (else /usr/local/bin/coloc-hook), never $COLOC_HOOK of the job's environment;
# a site wrapper names another one as `task_prolog.sh --hook=/abs/path/coloc-hook`.
exec /bin/sh "$(dirname "$0")/coloc-hook.sh" task-prolog "$@"
