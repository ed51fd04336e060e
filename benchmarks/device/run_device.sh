#!/usr/bin/env bash
# The device run of issue 8, one plan per device call (each must end inside 10 minutes):
#   benchmarks/device/run_device.sh A     run 1: small CNN and ResNet-18/32 x7, exclusive one after another vs coloc
#   benchmarks/device/run_device.sh B     runs 2-4: ResNet-50/224 x2/x4, OOM end to end, two users;
#                                         then a scaled-down trace replay if COLOC_BENCH_REPLAY=1
#   benchmarks/device/run_device.sh R     run 5 alone: trace replay (exclusive, then coloc) on every GPU
# Needs .carry/ from benchmarks/device/build_bundle.sh (carry: [".carry"]). Writes under $OUT (<= 8 files):
# log.txt, results.jsonl, replay.jsonl, report.txt, report.json, logs.tgz. Never changes GPU settings.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/coloc-out}; mkdir -p "$OUT"
ROOT=${COLOC_BENCH_ROOT:-/opt/coloc}
export COLOC_BENCH_ROOT=$ROOT COLOC_BENCH_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
T0=$(date +%s)
echo "== run_device.sh ${1:-?} on $(hostname) $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,name,memory.total,compute_mode,mig.mode.current --format=csv 2>/dev/null || true
"$REPO/benchmarks/device/cluster_gpu.sh" start || { echo "cluster start failed"; tail -30 "$ROOT"/log/*.log; exit 1; }
PY=$ROOT/venv/bin/python3
cd "$ROOT/src" || exit 1   # bench.py runs as a module of the source tree the cluster runs
B="$PY -m benchmarks.device.bench --out $OUT"
elapsed() { echo $(( $(date +%s) - T0 )); }
case "${1:-}" in
  A)
    $B collocate --workload small_cnn --k 7 --warmup-s 3 --measure-s 12 --coloc-measure-s 20
    echo "== elapsed $(elapsed) s"
    $B collocate --workload resnet18_32 --k 7 --warmup-s 3 --measure-s 12 --coloc-measure-s 20
    echo "== elapsed $(elapsed) s"
    if [ "$(elapsed)" -lt 470 ]; then $B two-users --measure-s 12; else echo "== two-users skipped (time)"; fi
    ;;
  B)
    $B two-users --measure-s 12
    echo "== elapsed $(elapsed) s"
    $B oom --measure-s 30 --offset-s 8
    echo "== elapsed $(elapsed) s"
    $B collocate --workload resnet50_224 --k 4 --exclusive-k 2 --warmup-s 3 --measure-s 12 --coloc-measure-s 20
    $B collocate --workload resnet50_224 --k 2 --warmup-s 3 --measure-s 12 --coloc-measure-s 20 --coloc-only
    echo "== elapsed $(elapsed) s"
    if [ "${COLOC_BENCH_REPLAY:-0}" = 1 ]; then
      left=$(( ${COLOC_BENCH_BUDGET_S:-555} - $(elapsed) - 25 ))
      COLOC_REPLAY_DEADLINE_S=$(( left * 3 / 4 )) COLOC_REPLAY_DEADLINE2_S=$(( left / 4 )) \
        "$REPO/benchmarks/device/replay_device.sh"
    fi
    ;;
  R)
    COLOC_REPLAY_DEADLINE_S=${COLOC_REPLAY_DEADLINE_S:-380} COLOC_REPLAY_DEADLINE2_S=${COLOC_REPLAY_DEADLINE2_S:-150} \
      "$REPO/benchmarks/device/replay_device.sh"
    ;;
  *) echo "usage: $0 A|B|R" >&2; exit 2 ;;
esac
echo "== elapsed $(elapsed) s; collecting"
export SLURM_CONF=$ROOT/etc/slurm.conf COLOC_CONFIG=$ROOT/etc/coloc.yaml
timeout 60 "$ROOT/venv/bin/coloc-report" > "$OUT/report.txt" 2>&1 || echo "coloc-report failed: $(tail -3 "$OUT/report.txt")"
timeout 60 "$ROOT/venv/bin/coloc-report" --json > "$OUT/report.json" 2>/dev/null || true
tar -C "$ROOT" -czf "$OUT/logs.tgz" jobs log coloc/state etc 2>/dev/null
$B summary
echo "== done in $(elapsed) s"
