#!/usr/bin/env bash
# The main job, end to end on a real local Slurm cluster (root, fresh Debian 12 is fine):
# install -> start munged/slurmctld/2 slurmd -> submit the digits CNN through coloc-sbatch as a normal
# user -> wait -> print the job's output and coloc-report. The cluster stays up: scripts/cluster.sh stop.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$REPO/scripts/install.sh"
"$REPO/scripts/cluster.sh" start
BASE=${COLOC_CLUSTER_DIR:-/tmp/coloc-cluster}
export SLURM_CONF=$BASE/etc/slurm.conf COLOC_CONFIG=$BASE/etc/coloc.yaml
VENV=${COLOC_VENV:-$REPO/.venv}
as_user() {
  runuser -u colocuser -- env PATH="$VENV/bin:/usr/bin:/bin" SLURM_CONF="$SLURM_CONF" COLOC_CONFIG="$COLOC_CONFIG" \
    COLOC_EXAMPLES="$REPO/examples" HOME=/home/colocuser "$@"
}
cd "$BASE/jobs"
echo "+ coloc-sbatch --dry-run $REPO/examples/train_digits.sh"
as_user coloc-sbatch --dry-run "$REPO/examples/train_digits.sh"
job=$(as_user coloc-sbatch --parsable -o "$BASE/jobs/digits-%j.out" "$REPO/examples/train_digits.sh")
echo "+ submitted job $job as colocuser; waiting for it to finish"
for _ in $(seq 600); do
  state=$(squeue --json | "$VENV/bin/python" -c "import json,sys; print(next((j['job_state'] for j in json.load(sys.stdin)['jobs'] if j['job_id']==$job), 'GONE'))")
  case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|GONE) break ;; esac
  sleep 1
done
echo "+ job $job ended $state; its output:"
cat "$BASE/jobs/digits-$job.out"
echo "+ coloc-report"
"$VENV/bin/coloc-report"
[ "$state" = COMPLETED ] || { echo "main.sh: job $job ended $state" >&2; exit 1; }
