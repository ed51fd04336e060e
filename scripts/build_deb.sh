#!/usr/bin/env bash
# Build the Debian 12 package slurm-coloc_<version>-1_<arch>.deb with Debian's own tools (python3-venv, pip,
# make/gcc against libslurm-dev, dpkg-deb). Run as any user on Debian 12 with scripts/install.sh's packages.
#
# Usage: scripts/build_deb.sh [OUT_DIR]        (default <repo>/dist; prints the .deb's path last)
#
# Layout (FHS; docs/admin.md "Production install"):
#   /usr/lib/slurm-coloc/venv/          the product and its dependencies (no torch) in a venv over Debian's
#                                       /usr/bin/python3: it never touches Debian's own python3 packages.
#                                       Its packages are pinned (deploy/debian/constraints.txt). PyTorch is a
#                                       site's: `coloc-admin torch DIR` links a site environment's torch + numpy
#   /usr/bin/coloc-*                    symlinks to the venv's console scripts
#   /usr/lib/slurm-coloc/hooks/         Prolog/Epilog/PrologSlurmctld/EpilogSlurmctld/TaskProlog shims
#   /usr/lib/slurm-coloc/coloc_spank.so the SPANK plugin built against this host's libslurm-dev (22.05)
#   /usr/share/slurm-coloc/spank/       its source and Makefile, to rebuild for another Slurm release
#   /lib/systemd/system/                coloc-sampler, coloc-placer (+ fallback timer), coloc-report units
#   /etc/init.d/coloc-{sampler,placer,report}  conffiles: the same daemons on hosts without systemd (generated
#                                       from deploy/init.d/coloc-daemon.in and each unit's ExecStart, caps)
#   /usr/share/slurm-coloc/constraints.txt  the venv's pins, for `pip install -c` into it
#   /etc/slurm-coloc/coloc.yaml         conffile: the sample, every key commented out at its default
#   /etc/logrotate.d/slurm-coloc        conffile
#   /usr/share/man/man1/coloc-*.1.gz    generated from each command's --help (scripts/gen_man.py)
# The wheel and sdist (python -m build) carry the same files under share/slurm-coloc (pyproject.toml data-files).
set -euo pipefail
# the payload's modes are the files' own (dpkg-deb keeps them): a builder's umask 077 would ship a package only
# root can run
umask 022
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$(mkdir -p "${1:-$REPO/dist}" && cd "${1:-$REPO/dist}" && pwd)
PY=/usr/bin/python3
die() { echo "build_deb.sh: $*" >&2; exit 1; }
for tool in dpkg-deb gcc make gzip; do command -v "$tool" >/dev/null || die "$tool is missing (scripts/install.sh)"; done
[ -f /usr/include/slurm/spank.h ] || die "/usr/include/slurm/spank.h is missing: apt-get install libslurm-dev"
"$PY" -c 'import ensurepip' 2>/dev/null || die "python3-venv is missing: apt-get install python3-venv"

VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$REPO/slurm_coloc/__init__.py")
ARCH=$(dpkg --print-architecture)
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PYNEXT=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1] + 1}")')
STAGE=$(mktemp -d /tmp/slurm-coloc-deb.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
ROOT=$STAGE/root
VENV=/usr/lib/slurm-coloc/venv

# 1. The product in a venv at its final path under the staging root, then made to live at /usr/lib/...
"$PY" -m venv "$ROOT$VENV"
log=$STAGE/pip.log
{ "$ROOT$VENV/bin/pip" wheel -q --no-deps --disable-pip-version-check -w "$STAGE/whl" "$REPO" &&
  "$ROOT$VENV/bin/pip" install -q --no-compile --disable-pip-version-check \
    -c "$REPO/deploy/debian/constraints.txt" "$(ls "$STAGE"/whl/*.whl)[gpu]"; } \
  >"$log" 2>&1 || { tail -20 "$log" >&2; die "pip failed"; }
# Exactly the pinned packages (and the product): a dependency that is not pinned fails the build.
extra=$("$ROOT$VENV/bin/pip" freeze --all --disable-pip-version-check 2>/dev/null | grep -v -i '^slurm[-_]coloc' |
        LC_ALL=C sort | LC_ALL=C comm -23 - <(grep -v "^#" "$REPO/deploy/debian/constraints.txt" | LC_ALL=C sort) || true)
[ -z "$extra" ] || die "the venv holds packages deploy/debian/constraints.txt does not pin: $extra"
cp "$STAGE"/whl/*.whl "$OUT/"
"$ROOT$VENV/bin/python3" -c 'import slurm_coloc, click, rich, yaml, sqlite_utils, prometheus_client, pynvml' ||
  die "the venv is incomplete"
# 2. Man pages from the CLI (before the paths are rewritten: the venv still runs from the staging root).
"$ROOT$VENV/bin/python3" "$REPO/scripts/gen_man.py" "$STAGE/man" >/dev/null
# Rewrite the staging root out of shebangs, activate scripts and pyvenv.cfg; no byte code (postinst compiles).
grep -rlI --null "$ROOT$VENV" "$ROOT$VENV/bin" "$ROOT$VENV/pyvenv.cfg" | xargs -0 -r sed -i "s|$ROOT$VENV|$VENV|g"
find "$ROOT$VENV" -name __pycache__ -prune -exec rm -rf {} +
! grep -rlI "$STAGE" "$ROOT$VENV/bin" "$ROOT$VENV/pyvenv.cfg" || die "staging path left in the venv"

# 3. The files pip put under <venv>/share/slurm-coloc (pyproject.toml data-files) to their FHS places.
SHARE=$ROOT$VENV/share/slurm-coloc
install -d "$ROOT/usr/bin" "$ROOT/usr/lib/slurm-coloc/hooks" "$ROOT/usr/share/slurm-coloc" "$ROOT/lib/systemd/system" \
  "$ROOT/etc/slurm-coloc" "$ROOT/etc/logrotate.d" "$ROOT/usr/share/man/man1" "$ROOT/usr/share/doc/slurm-coloc"
install -m 0755 "$SHARE"/hooks/*.sh "$ROOT/usr/lib/slurm-coloc/hooks/"
install -m 0644 "$SHARE"/systemd/* "$ROOT/lib/systemd/system/"
install -m 0644 "$SHARE/coloc.yaml" "$ROOT/etc/slurm-coloc/coloc.yaml"
install -m 0644 "$SHARE/coloc.yaml" "$ROOT/usr/share/slurm-coloc/coloc.yaml.sample"
install -m 0644 "$SHARE/logrotate/slurm-coloc" "$ROOT/etc/logrotate.d/slurm-coloc"
install -m 0644 "$REPO/deploy/debian/constraints.txt" "$ROOT/usr/share/slurm-coloc/constraints.txt"
# Init scripts for hosts without systemd: each unit's command and capability bounding set in the template.
install -d "$ROOT/etc/init.d"
for name in coloc-sampler coloc-placer coloc-report; do
  unit=$REPO/deploy/systemd/$name.service
  args=$(sed -n "s|^ExecStart=/usr/bin/$name ||p" "$unit")
  caps=$(sed -n 's/^CapabilityBoundingSet=//p' "$unit" | tr ' ' '\n' | sed 's/^CAP_//' | tr 'A-Z' 'a-z' |
         sed 's/^/+/' | paste -sd, -)
  what=$(sed -n 's/^Description=slurm-coloc //p' "$unit")
  [ -n "$args" ] && [ -n "$caps" ] || die "$unit: no ExecStart=/usr/bin/$name or CapabilityBoundingSet"
  sed -e "s|@NAME@|$name|g" -e "s|@ARGS@|$args|" -e "s|@CAPS@|-all,$caps|" -e "s|@WHAT@|$what|" \
    "$REPO/deploy/init.d/coloc-daemon.in" > "$ROOT/etc/init.d/$name"
  chmod 0755 "$ROOT/etc/init.d/$name"
done
cp -r "$SHARE/spank" "$ROOT/usr/share/slurm-coloc/spank"
rm -rf "$SHARE"
for exe in "$ROOT$VENV"/bin/coloc-*; do ln -s "../lib/slurm-coloc/venv/bin/${exe##*/}" "$ROOT/usr/bin/${exe##*/}"; done
# 4. The SPANK plugin, built from the packaged source against this host's Slurm headers.
cp -r "$ROOT/usr/share/slurm-coloc/spank" "$STAGE/spank"
make -s -C "$STAGE/spank" SLURM_VERSION=22.05 VERSION="$VERSION" OUT=coloc_spank.so >/dev/null
install -m 0755 "$STAGE/spank/coloc_spank.so" "$ROOT/usr/lib/slurm-coloc/coloc_spank.so"
# 5. Man pages, docs.
for m in "$STAGE"/man/*.1; do gzip -9n < "$m" > "$ROOT/usr/share/man/man1/${m##*/}.gz"; done
cp "$REPO/README.md" "$REPO"/docs/*.md "$ROOT/usr/share/doc/slurm-coloc/"
printf 'slurm-coloc\nLicense: Apache-2.0\nBundled Python packages in /usr/lib/slurm-coloc/venv carry their own licenses\n(see each *.dist-info directory there).\n' \
  > "$ROOT/usr/share/doc/slurm-coloc/copyright"

# 6. Control files.
install -d "$ROOT/DEBIAN"
install -m 0755 "$REPO"/deploy/debian/{postinst,prerm,postrm} "$ROOT/DEBIAN/"
printf '%s\n' /etc/slurm-coloc/coloc.yaml /etc/logrotate.d/slurm-coloc /etc/init.d/coloc-sampler \
  /etc/init.d/coloc-placer /etc/init.d/coloc-report > "$ROOT/DEBIAN/conffiles"
SIZE=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
cat > "$ROOT/DEBIAN/control" <<CONTROL
Package: slurm-coloc
Version: $VERSION-1
Section: admin
Priority: optional
Architecture: $ARCH
Maintainer: slurm-coloc developers <slurm-coloc@localhost>
Installed-Size: $SIZE
Depends: python3 (>= $PYVER), python3 (<< $PYNEXT), libc6
Recommends: slurm-client, munge, logrotate
Suggests: slurmd, slurmctld, nvidia-cuda-mps
Homepage: https://github.com/slurm-coloc/slurm-coloc
Description: pack small deep-learning training jobs onto shared GPUs under Slurm
 coloc-sbatch estimates a job's peak GPU memory and asks Slurm for that many
 GRES shards; root-run Prolog/Epilog hooks start CUDA MPS, fence each job's
 memory and rerun a job that died of CUDA OOM on a whole GPU; an NVML sampler
 records every GPU and job; coloc-placer places jobs by SM activity.
 .
 PyTorch (for estimates) is not included: install torch and numpy in a
 Python environment of the site's and link it with coloc-admin torch DIR
 where users submit jobs.
CONTROL
DEB=$OUT/slurm-coloc_${VERSION}-1_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz -z6 --build "$ROOT" "$DEB" >/dev/null
echo "$DEB"
