#!/usr/bin/env bash
# Item 9 of issue 29 on the GPU machine (root, no network): stand-in data into the carried corpus, the device
# harness cluster, then every corpus script through coloc-sbatch (probe on) as colocuser under its fence.
# Carried: .carry (benchmarks/device/build_bundle.sh) and .pubcarry (setup_corpus.py --out .pubcarry --kinds site).
# Usage: bash benchmarks/probe_public/device_fenced.sh [fenced_device.py options] [NAME...]
#   COLOC_BENCH_FAKE_GPUS=1 COLOC_BENCH_ROOT=/tmp/cbench COLOC_BENCH_PYTHON=$PWD/.venv/bin/python  (CPU check here)
# Results: $OUT/fenced.json, $OUT/fenced.txt (table), $OUT/setup.txt; job outputs in $OUT/jobs.tgz.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROOT=${COLOC_BENCH_ROOT:-/opt/coloc}
PY=${COLOC_BENCH_PYTHON:-/opt/torch/.venv/bin/python3}
VENV=${COLOC_PUB_VENV:-$(dirname "$(dirname "$PY")")}
OUT=${OUT:-/tmp/pubout}; mkdir -p "$OUT"
CORPUS=${COLOC_PUB_CORPUS:-$REPO/.pubcarry}
cd "$REPO" || exit 1
[ -f "$CORPUS/corpus.json" ] || { echo "device_fenced: no $CORPUS/corpus.json (carry .pubcarry)"; exit 1; }
t0=$(date +%s)
ACT=source; [ -f "$VENV/bin/activate" ] || { ACT=path; echo "device_fenced: no $VENV/bin/activate: jobs export PATH"; }
"$PY" -m benchmarks.probe_public.setup_corpus --no-export --out "$CORPUS" --venv "$VENV" --activate $ACT ${COLOC_PUB_SETUP_ARGS:-} >"$OUT/setup.txt" 2>&1 \
  || { tail -20 "$OUT/setup.txt"; exit 1; }
echo "device_fenced: stand-in data in $(( $(date +%s) - t0 )) s"
benchmarks/device/cluster_gpu.sh start >"$OUT/cluster.txt" 2>&1 || { tail -30 "$OUT/cluster.txt"; exit 1; }
echo "device_fenced: cluster up at $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 "$ROOT/venv/bin/python3" -m benchmarks.probe_public.fenced_device --corpus "$CORPUS" \
  --out "$OUT/fenced.json" "$@" 2>&1 | tee "$OUT/fenced.txt"
rc=${PIPESTATUS[0]}
tar -czf "$OUT/jobs.tgz" -C "$ROOT/jobs" --exclude=pub . 2>/dev/null
echo "device_fenced: done at $(( $(date +%s) - t0 )) s, rc $rc"
exit "$rc"
