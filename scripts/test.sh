#!/usr/bin/env bash
# The test command (what CI runs through .ci/run): install, build the SPANK plugin, lint (ruff) and type-check (mypy),
# build the Debian package, run pytest.
# The tests start and stop their own real Slurm clusters (reserved free ports, fresh directories, own munged:
# tests/slurm_cluster.py), so two pytest sessions can run at once.
#
# 1. The whole suite (not gpu) on Slurm 22.05 (Debian 12's, from apt).
# 2. The real-cluster tests of VERSION_TESTS on each of COLOC_TEST_VERSIONS (default "24.11 26.05"), fetched by
#    scripts/slurm_versions.sh (cached under /var/cache/slurm-coloc when the machine keeps it; about 10 s each
#    from a clean cache), the versions side by side (one background pytest each, every output line prefixed
#    with "[<version>] "). README "Slurm versions" says why this subset. COLOC_TEST_VERSIONS="" skips step 2.
# Arguments go to every pytest run (e.g. -x). Exit status: non-zero when any run failed.
# --fast (first argument): only the unit tests, in about 2 minutes: no install, build or lint, and no test marked
# gpu, slurm (a real cluster or namespace hosts) or slow (pyproject.toml); the other arguments go to pytest.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "${1-}" = --fast ]; then
  shift
  cd "$REPO"
  exec "${COLOC_VENV:-$REPO/.venv}/bin/python" -m pytest -q -m "not gpu and not slurm and not slow" "$@" tests
fi
"$REPO/scripts/install.sh"
make -s -C "$REPO/spank"
VENV=${COLOC_VENV:-$REPO/.venv}
cd "$REPO"
# The cluster tests run on every version: submission, hooks and final states, OOM rerun, SPANK, report,
# placement, watchdog, metrics endpoint, admin check.
VERSION_TESTS=(
  tests/cluster/test_main_job.py
  tests/cluster/test_oom_cluster.py
  tests/cluster/test_spank.py
  tests/cluster/test_mps_lifecycle.py
  tests/cluster/test_report_cluster.py
  tests/cluster/reliability/test_job_facts.py
  tests/cluster/reliability/test_hook_faults.py
  tests/cluster/reliability/test_rerun_confinement.py
  tests/cluster/test_placement_cluster.py
  tests/cluster/test_watchdog_cluster.py
  tests/cluster/test_prometheus.py
  tests/cluster/test_admin.py
)
"$VENV/bin/ruff" check "$REPO"
"$VENV/bin/mypy" "$REPO/slurm_coloc"
# The Debian package, built once: tests/test_deb_package.py and tests/cluster/test_multihost.py install it on
# namespace hosts (COLOC_DEB; without it they build their own).
rc=0
if deb=$("$REPO/scripts/build_deb.sh" "$REPO/dist"); then
  export COLOC_DEB=${deb##*$'\n'}
else
  echo "test.sh: scripts/build_deb.sh failed" >&2
  rc=1
fi
COLOC_SLURM=22.05 "$VENV/bin/python" -m pytest -q -m "not gpu" -p no:cacheprovider --durations=15 "$@" tests || rc=1
# The versions run side by side: their clusters share nothing (ports, directories, munged), and they mostly
# wait on Slurm, so two fit the 2-core CI machine (docs/benchmarks.md "Tests"). Each run is a process group of
# its own (set -m), so an interrupt of test.sh reaches both pytest runs, whose teardown stops their clusters.
set -m
pids=()
trap 'kill -INT -- "${pids[@]/#/-}" 2>/dev/null' INT TERM
for v in ${COLOC_TEST_VERSIONS-24.11 26.05}; do
  echo "== Slurm $v: ${#VERSION_TESTS[@]} cluster test files"
  if ! "$REPO/scripts/slurm_versions.sh" fetch "$v" >/dev/null; then
    echo "test.sh: Slurm $v could not be fetched" >&2
    rc=1
    continue
  fi
  (
    set +e +m
    start=$SECONDS
    COLOC_SLURM=$v "$VENV/bin/python" -m pytest -q -m "not gpu" -p no:cacheprovider "$@" "${VERSION_TESTS[@]}" \
      2>&1 | (trap "" INT; exec sed -u "s/^/[$v] /")   # sed outlives an interrupt: pytest's teardown prints
    status=${PIPESTATUS[0]}
    echo "== Slurm $v: $((SECONDS - start)) s, pytest exit $status"
    exit "$status"
  ) &
  pids+=("$!")
done
for pid in "${pids[@]}"; do
  while :; do   # a trapped interrupt ends wait early (status > 128) while the run still tears down
    st=0
    wait "$pid" || st=$?
    if [ "$st" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi
    break
  done
  [ "$st" = 0 ] || rc=1
done
exit "$rc"
