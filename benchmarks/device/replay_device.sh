#!/usr/bin/env bash
# Run 5 on the device: coloc-replay of the CARMA philly_mix trace (carried in .carry/carma by build_bundle.sh),
# exclusive then collocated, as colocuser, on the cluster cluster_gpu.sh started. Writes $OUT/replay.json.
#   COLOC_REPLAY_TASKS (default 8), COLOC_REPLAY_SCALE (time and work scale, default 0.004),
#   COLOC_REPLAY_DEADLINE_S / COLOC_REPLAY_DEADLINE2_S: cancel-after limits of the exclusive / coloc pass (s).
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROOT=${COLOC_BENCH_ROOT:-/opt/coloc}
OUT=${OUT:-/tmp/coloc-out}
install -d -m 0755 "$ROOT/carma"; cp -r "$REPO/.carry/carma/." "$ROOT/carma/"; chmod -R a+rX "$ROOT/carma"
D=$ROOT/carma
S=${COLOC_REPLAY_SCALE:-0.004}
as_user() {
  runuser -u colocuser -- env -i PATH="$ROOT/venv/bin:$ROOT/bin:/usr/bin:/bin" HOME=/home/colocuser USER=colocuser \
    SLURM_CONF="$ROOT/etc/slurm.conf" COLOC_CONFIG="$ROOT/etc/coloc.yaml" LD_LIBRARY_PATH="${COLOC_BENCH_LD_LIBRARY_PATH:-}" \
    COLOC_BENCH_PY="${COLOC_BENCH_PYTHON:-/opt/torch/.venv/bin/python3}" COLOC_BENCH_DIR="$ROOT/src/benchmarks/device" "$@"
}
ARGS=(--trace "$D/traces/philly_mix-90-tasks.csv" --catalog "$D/workload_catalog_from_rad.csv"
      --runtimes "$D/exclusive_run_summary.csv" --max-tasks "${COLOC_REPLAY_TASKS:-8}" --time-scale "$S" --work-scale "$S")
cd "$ROOT/jobs"
echo "+ coloc-replay plan ${ARGS[*]}"
as_user "$ROOT/venv/bin/coloc-replay" plan "${ARGS[@]}"
for mode in exclusive coloc; do
  dl=${COLOC_REPLAY_DEADLINE_S:-300}; [ $mode = coloc ] && dl=${COLOC_REPLAY_DEADLINE2_S:-150}
  echo "+ coloc-replay run ${ARGS[*]} --mode $mode --deadline-s $dl --job-script .../job_generic.sh --json"
  as_user "$ROOT/venv/bin/coloc-replay" run "${ARGS[@]}" --mode $mode --deadline-s "$dl" \
    --job-script "$ROOT/src/benchmarks/device/job_generic.sh" --out-dir "$ROOT/jobs" --json > "$OUT/replay-$mode.json"
  cat "$OUT/replay-$mode.json" | head -40
done
"$ROOT/venv/bin/python3" - "$OUT" <<'PYEOF'
import json, sys
from slurm_coloc.replay.metrics import compare
out = sys.argv[1]
ex, co = (json.load(open(f"{out}/replay-{m}.json"))[m] for m in ("exclusive", "coloc"))
res = {"exclusive": ex, "coloc": co, "change": compare(ex, co)}
json.dump(res, open(f"{out}/replay.json", "w"), indent=1)
print("REPLAY", json.dumps(res["change"]))
for k in ("completed", "lost", "oom_retries", "makespan_s", "mean_jct_s", "mean_smact_pct", "energy_j"):
    print(f"  {k:<16} exclusive {ex.get(k)}  coloc {co.get(k)}")
PYEOF
rm -f "$OUT/replay-exclusive.json" "$OUT/replay-coloc.json"
