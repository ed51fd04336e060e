#!/usr/bin/env bash
# Issue 32 on the device: run 5's trace replay (philly mix) under exclusive, blind, gate and throughput, on every
# GPU of the machine, in one device call (< 9.5 min). Root; needs .carry/ (build_bundle.sh: the Slurm bundle and
# .carry/carma, the CARMA trace files). Starts the cluster with typed shards (the placer steers jobs to one GPU),
# then placement_replay.py in the cluster's venv. Writes under $OUT: log.txt, replay-<mode>.json, replay.md,
# replay.json, placer.log, logs.tgz.
#   COLOC_REPLAY_TASKS   tasks of the trace (default: 16 on H200s, the issue's run 5; 12 elsewhere: the H100's
#                        exclusive pass is slower), COLOC_REPLAY_SCALE (0.004), COLOC_BENCH_BUDGET_S (540)
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/coloc-out}; mkdir -p "$OUT"
ROOT=${COLOC_BENCH_ROOT:-/opt/coloc}
export COLOC_BENCH_ROOT=$ROOT COLOC_BENCH_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1 COLOC_GRES_TYPED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
T0=$(date +%s)
echo "== placement_replay.sh on $(hostname) $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,name,memory.total,compute_mode,mig.mode.current --format=csv 2>/dev/null || true
[ -f "$REPO/.carry/carma/traces/philly_mix-90-tasks.csv" ] || { echo "no .carry/carma (run benchmarks/device/build_bundle.sh)"; exit 2; }
if [ -z "${COLOC_REPLAY_TASKS:-}" ]; then
  COLOC_REPLAY_TASKS=12
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && COLOC_REPLAY_TASKS=16
fi
"$REPO/benchmarks/device/cluster_gpu.sh" stop >/dev/null 2>&1
"$REPO/benchmarks/device/cluster_gpu.sh" start || { echo "cluster start failed"; tail -30 "$ROOT"/log/*.log; exit 1; }
echo "== cluster up in $(( $(date +%s) - T0 )) s; $COLOC_REPLAY_TASKS tasks"
install -d -m 0755 "$ROOT/carma"; cp -r "$REPO/.carry/carma/." "$ROOT/carma/"; chmod -R a+rX "$ROOT/carma"
(cd "$REPO" && "$ROOT/venv/bin/python3" -m benchmarks.device.placement_replay --out "$OUT" --started-at "$T0" \
  --budget-s "${COLOC_BENCH_BUDGET_S:-540}" --tasks "$COLOC_REPLAY_TASKS" --scale "${COLOC_REPLAY_SCALE:-0.004}")
rc=$?
tar -C "$ROOT" -czf "$OUT/logs.tgz" jobs log etc 2>/dev/null
echo "== done in $(( $(date +%s) - T0 )) s (exit $rc)"
exit $rc
