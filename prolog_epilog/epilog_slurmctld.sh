#!/bin/sh
# Slurm epilog_slurmctld shim for slurm-coloc (slurm.conf: see docs/admin.md). Always exits 0.
exec /bin/sh "$(dirname "$0")/coloc-hook.sh" epilog-slurmctld
