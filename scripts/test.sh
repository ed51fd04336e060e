#!/usr/bin/env bash
# The test command (what CI runs through .ci/run): install, build the SPANK plugin, run pytest.
# The tests start and stop their own real Slurm clusters (free ports, own directories).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$REPO/scripts/install.sh"
make -s -C "$REPO/spank"
VENV=${COLOC_VENV:-$REPO/.venv}
cd "$REPO"
exec "$VENV/bin/python" -m pytest -q -m "not gpu" -p no:cacheprovider "$@" tests
