#!/usr/bin/env bash
# Newer Slurm releases beside Debian 12's own 22.05, without touching the system: the .debs of the Debian suite
# that ships the release are downloaded through a private apt sources list and state dir, extracted under a cache
# root, and every program is run through THAT suite's dynamic loader with its own libraries first
# (<root>/.../ld-linux-x86-64.so.2 --library-path <lib dirs> <program>), so the machine's libc is never replaced
# and nothing (no LD_LIBRARY_PATH) leaks into the processes the daemons start (hooks, jobs).
#
# Usage: scripts/slurm_versions.sh <command> <version>
#   fetch   V   download + extract + write wrappers (idempotent: a complete cache is reused); prints the bin dir
#   env     V   prints shell assignments: SLURM_VERSION SLURM_BIN SLURM_SBIN SLURM_PLUGIN_DIR SLURM_INCLUDE
#               SLURM_ROOT SLURM_LDSO SLURM_LIBS (22.05 = the system's apt packages: SLURM_PLUGIN_DIR empty)
#   newest      the newest version that runs here (tries 26.05, 24.11, then 22.05); prints it
#   relocate R P   patch an extracted copy R of a fetched root to live at P (the GPU harness's bundle)
#   list        the versions this script knows, with their Debian suite
# Versions: 22.05 (system, bookworm), 24.11 (trixie), 26.05 (sid).
#   COLOC_SLURM_CACHE   cache root (default /var/cache/slurm-coloc; <root>/<version>/ per version)
#   COLOC_SLURM_MIRROR  Debian mirror URI (default: the machine's own, from /etc/apt/sources.list.d/debian.sources)
# Layout of <cache>/<version>/: root/ (dpkg-deb -x of every package, programs and libraries patched to use the
# suite's loader and libraries), bin/ (sbatch, scontrol, ..., slurmctld: links; slurmd: a wrapper), libexec/,
# debs.txt (package=version list), complete (stamp written last; a stamp of an older layout is fetched again).
# munge (munged, munge, unmunge) comes along for machines without their own (the GPU harness); clusters here run
# the machine's munged (one per cluster, scripts/cluster.sh), which the suite's libmunge talks to.
# slurmd starts /usr/sbin/slurmstepd (compiled-in path): the bin/slurmd wrapper runs slurmd in a private mount
# namespace where bin/slurmstepd is bind-mounted over /usr/sbin/slurmstepd (the system's 22.05 one stays for
# everyone else).
set -euo pipefail
CACHE=${COLOC_SLURM_CACHE:-/var/cache/slurm-coloc}
ARCH=x86_64-linux-gnu
LAYOUT=layout=2

die() { echo "slurm_versions.sh: $*" >&2; exit 1; }

suite_of() {
  case "$1" in
    22.05) echo bookworm ;;
    24.11) echo trixie ;;
    26.05) echo sid ;;
    *) die "unknown Slurm version '$1' (known: 22.05 24.11 26.05)" ;;
  esac
}

mirror() {
  if [ -n "${COLOC_SLURM_MIRROR:-}" ]; then echo "$COLOC_SLURM_MIRROR"; return; fi
  local uri
  uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

# apt_opts <dir>: apt-get/apt-cache options for a private sources list, index, cache and (empty) dpkg status.
apt_opts() {
  echo "-o Dir::Etc::sourcelist=$1/sources.list -o Dir::Etc::sourceparts=- -o Dir::State::Lists=$1/lists" \
       "-o Dir::Cache=$1/cache -o Dir::State::status=$1/status -o Debug::NoLocking=1 -o APT::Get::List-Cleanup=0"
}

# loader <root>: the suite's dynamic loader (merged-/usr or not).
loader() {
  local p
  for p in "$1/usr/lib/$ARCH/ld-linux-x86-64.so.2" "$1/lib/$ARCH/ld-linux-x86-64.so.2" "$1/usr/lib64/ld-linux-x86-64.so.2" \
           "$1/lib64/ld-linux-x86-64.so.2"; do
    [ -e "$p" ] && { echo "$p"; return; }
  done
  return 1
}

# libs <root>: the library path, the suite's own dirs first, the machine's last (for what the suite lacks).
libs() {
  local r=$1 out="" d
  for d in "$r/usr/lib/$ARCH/slurm-wlm" "$r/usr/lib/$ARCH" "$r/lib/$ARCH"; do [ -d "$d" ] && out="$out:$d"; done
  echo "${out#:}:/usr/lib/$ARCH:/lib/$ARCH"
}

# closure <Packages file> <seed>...: package names of the shared-library closure: the seeds, then every
# Depends/Pre-Depends alternative named lib* or zlib* (the first one the index has), recursively, read from the suite's
# index (apt-cache dumpavail). Daemon/tool dependencies (munge, ucf, adduser) are not followed: the machine's munged serves the
# suite's libmunge, and nothing else is run from the suite.
closure() {
  local avail=$1; shift
  python3 - "$avail" "$@" <<'PY'
import re, sys
deps = {}
for path in sys.argv[1:2]:
    for stanza in open(path, encoding="utf-8", errors="replace").read().split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if "Package" in fields:
            deps.setdefault(fields["Package"], ",".join(filter(None, (fields.get("Pre-Depends"), fields.get("Depends")))))
skip = re.compile(r"^(libc-dev-bin|libc6-dev|libcrypt-dev|linux-libc-dev|lib.*-dev)$")
todo, seen = list(sys.argv[2:]), []
while todo:
    p = todo.pop()
    if p in seen:
        continue
    if p not in deps:
        sys.exit(f"package {p} not in the index")
    seen.append(p)
    for dep in filter(None, (d.strip() for d in deps[p].split(","))):
        for alt in dep.split("|"):
            name = re.sub(r"\(.*?\)|\[.*?\]|:any", "", alt).strip()
            if not name.startswith(("lib", "zlib")) or skip.match(name):
                break
            if name in deps:
                todo.append(name)
                break
print(" ".join(sorted(seen)))
PY
}

# patch_root <root> <prefix>: make every program and library under <root> use the suite's loader and libraries
# once <root> lives at <prefix> (the same path, or where a bundle is unpacked): PT_INTERP = the suite's
# ld-linux-x86-64.so.2 and DT_RPATH = the suite's library dirs (DT_RPATH is searched before LD_LIBRARY_PATH, so a
# caller's LD_LIBRARY_PATH cannot pull in the machine's libraries). Runs the suite's patchelf through the suite's
# loader. Programs must be patched rather than started as `ld.so --library-path ... <program>`: slurmctld
# (>= 23.x) starts slurmscriptd, and slurmd re-executes itself, through /proc/self/exe, which would be the bare
# loader.
patch_root() {
  local r=$1 prefix=$2 ldso rpath="" d interp f
  ldso=$(loader "$r") || die "no ld-linux-x86-64.so.2 in $r"
  interp=$prefix${ldso#"$r"}
  for d in usr/lib/$ARCH/slurm-wlm usr/lib/$ARCH lib/$ARCH; do [ -d "$r/$d" ] && rpath="$rpath:$prefix/$d"; done
  rpath=${rpath#:}
  [ -x "$r/usr/bin/patchelf" ] || die "no patchelf in $r"
  # patchelf runs from a copy of itself and its libraries: rewriting libstdc++ in place under a running patchelf
  # that maps it crashes it.
  local pd lib
  pd=$(mktemp -d /tmp/coloc-patchelf.XXXXXX)
  for lib in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libstdc++.so.6 libgcc_s.so.1; do
    cp -L "$(dirname "$ldso")/$lib" "$pd/" 2>/dev/null || cp -L "$r/lib/$ARCH/$lib" "$pd/" || cp -L "$r/usr/lib/$ARCH/$lib" "$pd/"
  done
  cp "$r/usr/bin/patchelf" "$pd/"
  local pe=("$pd/ld-linux-x86-64.so.2" --library-path "$pd" "$pd/patchelf")
  local elfs=() exes=()
  while IFS= read -r -d '' f; do
    case "${f##*/}" in ld-linux*|libc.so.6|patchelf) continue ;; esac
    [ "$(head -c4 "$f" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ] || continue
    elfs+=("$f")
    case "$f" in "$r"/usr/bin/*|"$r"/usr/sbin/*) exes+=("$f") ;; esac
  done < <(find "$r" -type f \( -name '*.so*' -o -path '*/bin/*' -o -path '*/sbin/*' \) -print0)
  printf '%s\0' "${elfs[@]}" | xargs -0 -n 100 "${pe[@]}" --force-rpath --set-rpath "$rpath"
  for f in "${exes[@]}"; do
    if "${pe[@]}" --print-interpreter "$f" >/dev/null 2>&1; then "${pe[@]}" --set-interpreter "$interp" "$f"; fi
  done
  rm -rf "$pd"
}

# write_wrappers <dir> <version> <suite>: bin/ with the client commands and daemons (symlinks to the patched
# programs) and a slurmd wrapper. slurmd starts the compiled-in /usr/sbin/slurmstepd: the wrapper runs it in a
# private mount namespace where the suite's slurmstepd is bind-mounted over that path (the machine's own stays for
# everyone else; the path must exist: Debian's slurmd package provides it).
write_wrappers() {
  local d=$1 r=$1/root p src
  install -d -m 0755 "$d/bin" "$d/libexec"
  for p in sbatch scontrol squeue sinfo scancel srun salloc sacct sstat sprio sdiag sattach sbcast sshare strigger \
           sreport sacctmgr scrontab; do
    if [ -x "$r/usr/bin/$p" ]; then ln -sfn "$r/usr/bin/$p" "$d/bin/$p"; fi
  done
  for p in slurmctld slurmstepd slurmd; do
    src=$r/usr/sbin/$p-wlm; [ -x "$src" ] || src=$r/usr/sbin/$p
    [ -x "$src" ] || die "no $p in $r/usr/sbin"
    ln -sfn "$src" "$d/libexec/$p"
  done
  ln -sfn "$d/libexec/slurmctld" "$d/bin/slurmctld"
  ln -sfn "$d/libexec/slurmstepd" "$d/bin/slurmstepd"
  cat > "$d/bin/slurmd" <<EOF
#!/bin/sh
# slurm-coloc: Slurm $2 ($3) slurmd, /usr/sbin/slurmstepd bound to its own slurmstepd in a private mount namespace
# (scripts/slurm_versions.sh)
[ -e /usr/sbin/slurmstepd ] || { echo "slurmd: /usr/sbin/slurmstepd must exist (Debian's slurmd package)" >&2; exit 1; }
exec unshare --mount --propagation private sh -c 'mount --bind "\$0" /usr/sbin/slurmstepd && exec "\$@"' \\
  $d/libexec/slurmstepd $d/libexec/slurmd "\$@"
EOF
  chmod 0755 "$d/bin/slurmd"
}

fetch() {
  local v=$1 suite d opts pkgs p
  suite=$(suite_of "$v")
  [ "$v" != 22.05 ] || { echo /usr/bin; return; }
  d=$CACHE/$v
  if grep -qs "$LAYOUT" "$d/complete"; then echo "$d/bin"; return; fi
  command -v dpkg-deb >/dev/null && command -v apt-get >/dev/null || die "needs apt-get and dpkg-deb (Debian)"
  [ "$(id -u)" = 0 ] || die "fetch must run as root (cache under $CACHE)"
  install -d -m 0755 "$CACHE"
  tmp=$(mktemp -d "$CACHE/.fetch-$v.XXXXXX")   # global: the EXIT trap removes it
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/apt/lists/partial" "$tmp/apt/cache/archives/partial" "$tmp/debs" "$tmp/root"
  : > "$tmp/apt/status"
  echo "deb $(mirror) $suite main" > "$tmp/apt/sources.list"
  opts=$(apt_opts "$tmp/apt")
  apt-get $opts -q update >"$tmp/apt.log" 2>&1 || { tail -5 "$tmp/apt.log" >&2; die "apt-get update ($suite) failed"; }
  local have
  have=$(apt-cache $opts show --no-all-versions slurmctld 2>/dev/null | sed -n 's/^Version: //p')
  case "$have" in "$v".*) ;; *) die "Debian $suite serves slurmctld '${have:-none}', not $v.x" ;; esac
  apt-cache $opts dumpavail > "$tmp/avail"
  pkgs=$(closure "$tmp/avail" slurmctld slurmd slurm-client slurm-wlm-basic-plugins libslurm-dev libc6 patchelf munge)
  (cd "$tmp/debs" && apt-get $opts -q download $pkgs >>"$tmp/apt.log" 2>&1) ||
    { tail -5 "$tmp/apt.log" >&2; die "apt-get download ($suite) failed"; }
  for p in "$tmp"/debs/*.deb; do dpkg-deb -x "$p" "$tmp/root"; done
  rm -rf "$tmp/root/usr/share/doc" "$tmp/root/usr/share/man" "$tmp/root/usr/share/locale" "$tmp/root/usr/share/lintian"
  (cd "$tmp/debs" && ls *.deb | sed 's/_amd64\.deb$\|_all\.deb$//; s/_/=/' | sed 's/%3a/:/') > "$tmp/debs.txt"
  rm -rf "$d"; install -d -m 0755 "$d"
  mv "$tmp/root" "$d/root"; mv "$tmp/debs.txt" "$d/debs.txt"
  patch_root "$d/root" "$d/root"
  write_wrappers "$d" "$v" "$suite"
  local got
  got=$("$d/bin/slurmctld" -V 2>&1) || die "$d/bin/slurmctld -V failed: $got"
  case "$got" in "slurm-wlm $v".*|"slurm $v".*) ;; *) die "$d/bin/slurmctld -V printed '$got'" ;; esac
  echo "$got $suite $(wc -l < "$d/debs.txt") packages $(du -sh "$d/root" | cut -f1) $LAYOUT" > "$d/complete"
  rm -rf "$tmp"; trap - EXIT
  echo "$d/bin"
}

env_of() {
  local v=$1 d r
  suite_of "$v" >/dev/null
  if [ "$v" = 22.05 ]; then
    printf 'SLURM_VERSION=22.05\nSLURM_BIN=/usr/bin\nSLURM_SBIN=/usr/sbin\nSLURM_PLUGIN_DIR=\nSLURM_INCLUDE=/usr/include\n'
    printf 'SLURM_ROOT=/\nSLURM_LDSO=\nSLURM_LIBS=\n'
    return
  fi
  d=$CACHE/$v; r=$d/root
  grep -qs "$LAYOUT" "$d/complete" || die "Slurm $v is not fetched (scripts/slurm_versions.sh fetch $v)"
  printf 'SLURM_VERSION=%s\nSLURM_BIN=%s\nSLURM_SBIN=%s\nSLURM_PLUGIN_DIR=%s\nSLURM_INCLUDE=%s\n' \
    "$v" "$d/bin" "$d/bin" "$r/usr/lib/$ARCH/slurm-wlm" "$r/usr/include"
  printf 'SLURM_ROOT=%s\nSLURM_LDSO=%s\nSLURM_LIBS=%s\n' "$r" "$(loader "$r")" "$(libs "$r")"
}

newest() {
  local v
  for v in 26.05 24.11; do
    if fetch "$v" >/dev/null 2>&1; then echo "$v"; return; fi
  done
  echo 22.05
}

case "${1:-}" in
  fetch) [ -n "${2:-}" ] || die "usage: $0 fetch <version>"; fetch "$2" ;;
  env) [ -n "${2:-}" ] || die "usage: $0 env <version>"; env_of "$2" ;;
  newest) newest ;;
  relocate) [ -d "${2:-}" ] && [ -n "${3:-}" ] || die "usage: $0 relocate <root copy> <prefix>"; patch_root "$2" "$3" ;;
  list) for v in 22.05 24.11 26.05; do echo "$v $(suite_of $v)"; done ;;
  *) echo "usage: $0 fetch|env <22.05|24.11|26.05> | newest | list" >&2; exit 2 ;;
esac
