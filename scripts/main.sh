#!/usr/bin/env bash
# The main job, end to end on a real local Slurm cluster (root, fresh Debian 12 is fine):
# install -> start munged/slurmctld/2 slurmd -> submit the digits CNN through coloc-sbatch as a normal
# user -> wait -> print the job's output and coloc-report. The cluster stays up: scripts/cluster.sh stop.
# COLOC_SLURM=22.05|24.11|26.05 picks the Slurm version (default: scripts/cluster.sh's, the newest that works).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$REPO/scripts/install.sh"
"$REPO/scripts/cluster.sh" start
BASE=${COLOC_CLUSTER_DIR:-/tmp/coloc-cluster}
eval "$("$REPO/scripts/cluster.sh" env)"  # SLURM_CONF COLOC_CONFIG COLOC_SLURM COLOC_SLURM_BIN of the running cluster
export SLURM_CONF COLOC_CONFIG
export PATH="$COLOC_SLURM_BIN:$PATH"
echo "+ Slurm $COLOC_SLURM ($COLOC_SLURM_BIN)"
VENV=${COLOC_VENV:-$REPO/.venv}
as_user() {
  runuser -u colocuser -- env PATH="$VENV/bin:$COLOC_SLURM_BIN:/usr/bin:/bin" SLURM_CONF="$SLURM_CONF" \
    COLOC_CONFIG="$COLOC_CONFIG" \
    COLOC_EXAMPLES="$REPO/examples" HOME=/home/colocuser "$@"
}
cd "$BASE/jobs"
echo "+ coloc-sbatch --dry-run $REPO/examples/train_digits.sh"
as_user coloc-sbatch --dry-run "$REPO/examples/train_digits.sh"
job=$(as_user coloc-sbatch --parsable -o "$BASE/jobs/digits-%j.out" "$REPO/examples/train_digits.sh")
echo "+ submitted job $job as colocuser; waiting for it to finish"
# The job's state as squeue --json --states=all prints it (22.05: one word; 24.11+: [base state, flags...], with
# COMPLETING among the flags while the epilogs run): "<state>" once ended and its epilogs are done.
job_state() {
  "$COLOC_SLURM_BIN/squeue" --json --states=all | "$VENV/bin/python" -c "
import json, sys
from slurm_coloc.slurm.jobinfo import parse_squeue_json
j = next((j for j in parse_squeue_json(sys.stdin.read()) if j.job_id == $job), None)
print('GONE' if j is None else 'COMPLETING' if j.completing else j.state)"
}
for _ in $(seq 600); do
  state=$(job_state)
  case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|GONE) break ;; esac
  sleep 1
done
echo "+ job $job ended $state; its output:"
cat "$BASE/jobs/digits-$job.out"
echo "+ coloc-report"
"$VENV/bin/coloc-report"
[ "$state" = COMPLETED ] || { echo "main.sh: job $job ended $state" >&2; exit 1; }
