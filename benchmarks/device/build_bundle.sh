#!/usr/bin/env bash
# Build what the GPU test machine lacks, HERE (Debian 12, root), into <repo>/.carry/ (git-ignored, carried with
# the device tool's `carry`):
#   .carry/slurm-bundle.tar.gz  Debian 12's Slurm 22.05.8 + munge: the .deb contents (apt-get download +
#                               dpkg-deb -x) and every non-glibc shared library that ldd lists for the binaries
#                               and plugins (glibc itself is never bundled: the machine's own is used).
#   .carry/whl/                 wheels of the package's pure-Python needs the machine lacks (sqlite-utils & co).
# Usage: benchmarks/device/build_bundle.sh        (idempotent; prints the carried size)
#   COLOC_SLURM=24.11|26.05  bundle that release instead (scripts/slurm_versions.sh fetch: the suite's own
#                            glibc, loader and libraries; programs patched to run from COLOC_BENCH_ROOT/slurm,
#                            default /opt/coloc/slurm, as benchmarks/device/cluster_gpu.sh unpacks it there)
# The bundle's bundle.env names its version (SLURM_VERSION) and layout (patched: run programs directly).
# Facts behind it: docs/facts.md §13, "Slurm on the GPU test machine".
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CARRY=$REPO/.carry
WORK=$(mktemp -d /tmp/coloc-bundle.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
VERSION=${COLOC_SLURM:-22.05}
PKGS="slurmctld slurmd slurm-client libslurm38 slurm-wlm-basic-plugins munge libmunge2"
mkdir -p "$CARRY/whl" "$WORK/debs" "$WORK/root"
R=$WORK/root
if [ "$VERSION" = 22.05 ]; then
  (cd "$WORK/debs" && apt-get download $PKGS >/dev/null 2>&1) || { echo "build_bundle: apt-get download failed" >&2; exit 1; }
  for d in "$WORK"/debs/*.deb; do dpkg-deb -x "$d" "$WORK/root"; done
  echo "SLURM_VERSION=22.05 LAYOUT=bundle-lib" > "$R/bundle.env"
else
  "$REPO/scripts/slurm_versions.sh" fetch "$VERSION" >/dev/null
  eval "$("$REPO/scripts/slurm_versions.sh" env "$VERSION")"
  cp -a "$SLURM_ROOT/." "$R/"
  "$REPO/scripts/slurm_versions.sh" relocate "$R" "${COLOC_BENCH_ROOT:-/opt/coloc}/slurm"
  echo "SLURM_VERSION=$VERSION LAYOUT=patched" > "$R/bundle.env"
fi
# Canonical program names (Slurm decides what it is from its name; the .debs ship slurmctld-wlm etc.).
for p in slurmctld slurmd slurmstepd; do
  if [ ! -e "$R/usr/sbin/$p" ] || [ -L "$R/usr/sbin/$p" ]; then
    src=$(ls "$R"/usr/sbin/$p-wlm 2>/dev/null || true)
    [ -n "$src" ] || { echo "build_bundle: no $p in the packages" >&2; exit 1; }
    rm -f "$R/usr/sbin/$p"; cp "$src" "$R/usr/sbin/$p"
  fi
done
# Non-glibc libraries every binary and plugin needs (resolved on this Debian 12 host; 22.05 only: newer
# releases carry their whole library closure and glibc, and their programs name a loader under
# COLOC_BENCH_ROOT that does not exist here, so ldd cannot read them).
mkdir -p "$R/bundle-lib"
if [ "$VERSION" = 22.05 ]; then
  GLIBC='^(linux-vdso|libc\.so|ld-linux|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libutil\.so|libnsl|libanl|libcrypt\.so)'
  find "$R/usr/sbin" "$R/usr/bin" "$R/usr/lib" -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
    xargs -0 ldd 2>/dev/null | awk '/=> \//{print $1" "$3}' | sort -u |
    while read -r name path; do
      echo "$name" | grep -Eq "$GLIBC" && continue
      case "$path" in "$R"/*) continue ;; esac
      [ -e "$R/bundle-lib/$name" ] || cp -L "$path" "$R/bundle-lib/$name"
    done
fi
# Debian's libslurm lives in slurm-wlm/ (RUNPATH absolute to /usr/lib/...): list the bundle's own dirs too.
rm -rf "$R/usr/share/doc" "$R/usr/share/man" "$R/usr/share/lintian" "$R/etc/init.d"
tar -C "$R" -czf "$CARRY/slurm-bundle.tar.gz" .
# Wheels (pure Python) the machine lacks: KINDS.md's package list has click, rich, pyyaml, tabulate,
# python-dateutil, pluggy, nvidia-ml-py and torch but not sqlite-utils and its two small needs.
for w in sqlite-utils==4.2.1 sqlite-fts4==1.0.3 click-default-group==1.2.4; do
  n=${w%%==*}; n=${n//-/_}
  ls "$CARRY"/whl/${n}-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 -d "$CARRY/whl" "$w"
done
# The CARMA trace data of run 5 (Apache-2.0, shared/data/carma): the trace, catalog and run summary only.
DATA=${COLOC_CARMA_DIR:-$REPO/../shared/data/carma}
if [ -d "$DATA" ]; then
  mkdir -p "$CARRY/carma/traces"
  cp "$DATA/workload_catalog_from_rad.csv" "$DATA/exclusive_run_summary.csv" "$DATA/LICENSE-Apache-2.0.txt" "$CARRY/carma/"
  cp "$DATA/traces/philly_mix-90-tasks.csv" "$CARRY/carma/traces/"
fi
echo "build_bundle: $(du -sh "$CARRY/slurm-bundle.tar.gz" | cut -f1) bundle, $(ls "$CARRY/whl" | wc -l) wheels; .carry total $(du -sh "$CARRY" | cut -f1)"
