"""Which sbatch options take a value, read from the installed sbatch (``--help`` and ``--usage``).

coloc-sbatch must tell an option's value from the job script (``--segment 2 train.sh``). Options are read
from ``slurm_bin_dir``'s sbatch and cached per binary (``installed_options``), so a newer release is read as
it is. The help is neither complete nor exact, so the table is completed by ``BUILTIN_22_05`` (22.05.8's
``slurm_opt.c`` options taking a value, some missing from its help: ``--hint``, ``--batch``, ...; the whole
table when sbatch cannot run) and ``GETOPT_REQUIRED`` (shown optional or without value while ``slurm_opt.c``
declares ``required_argument``: ``--export[=names]``, ``--wrap``, ``--container``).

``--opt[=value]`` takes its value only as ``--opt=value`` (getopt's optional argument). Options neither table
knows (26.05's ``--segment``, ``--prefer``, ``--extra``) are decided in ``submit/request.py``: the next word
is their value unless it is an existing file, the script.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Mapping, Optional, Set, Tuple

from slurm_coloc.errors import SlurmError
from slurm_coloc.slurm.run import run

CACHE_VERSION = 1
HELP_TIMEOUT_S = 5.0  # sbatch without a reachable config retries DNS: a bound, not a cost

#: Slurm 22.05.8 short options that take a value (``-J name`` or ``-Jname``).
BUILTIN_SHORT_VALUE = frozenset("aAbBcdDeiJLMmnNopqStwxCFG")
#: Slurm 22.05.8 long options that take a required value (``--opt=v`` or ``--opt v``).
BUILTIN_22_05 = frozenset({
    "array", "account", "bb", "bbf", "begin", "comment", "cpu-freq", "cpus-per-task", "dependency",
    "deadline",
    "delay-boot", "chdir", "error", "export-file", "gid", "gres", "gres-flags", "input", "job-name",
    "licenses",
    "clusters", "cluster", "distribution", "mail-type", "mail-user", "mcs-label", "ntasks", "ntasks-per-node",
    "nodes", "output", "partition", "power", "priority", "profile", "qos", "core-spec", "signal", "switches",
    "thread-spec", "time", "time-min", "uid", "wckey", "cluster-constraint", "constraint", "nodefile", "mem",
    "mincpus", "reservation", "tmp", "nodelist", "exclude", "mem-per-cpu", "sockets-per-node",
    "cores-per-socket", "threads-per-core", "ntasks-per-core", "ntasks-per-socket", "cpus-per-gpu", "gpus",
    "gpu-bind", "gpu-freq", "gpus-per-node", "gpus-per-socket", "gpus-per-task", "mem-per-gpu", "container",
    "extra-node-info", "hint", "batch", "acctg-freq", "open-mode", "kill-on-invalid-dep", "wrap", "export",
    "mem-bind", "network", "ntasks-per-gpu",
})
#: Help shows these as ``--opt[=v]`` or without a value; slurm_opt.c (22.05.8, 26.05.5) declares a required
#: one.
GETOPT_REQUIRED = frozenset({"export", "wrap", "container"})
#: Short letters and the long option they stand for (22.05.8 help; later releases keep them).
BUILTIN_SHORT_TO_LONG = {"a": "array", "A": "account", "b": "begin", "B": "extra-node-info",
                         "c": "cpus-per-task",
                         "C": "constraint", "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile",
                         "G": "gpus", "H": "hold", "i": "input", "J": "job-name", "k": "no-kill",
                         "L": "licenses",
                         "M": "clusters", "m": "distribution", "n": "ntasks", "N": "nodes", "o": "output",
                         "O": "overcommit", "p": "partition", "q": "qos", "Q": "quiet", "s": "oversubscribe",
                         "S": "core-spec", "t": "time", "v": "verbose", "W": "wait", "w": "nodelist",
                         "x": "exclude"}

# one option in --help: "  -J, --job-name=jobname", "      --export[=names]", "  -B  --extra-node-info=S[:C]"
# (the help never prints "--opt value": a word after spaces is the description)
_HELP_LINE = re.compile(r"^\s{1,8}(?:-(?P<short>[A-Za-z]),?\s+)?--(?P<name>[A-Za-z0-9][A-Za-z0-9-]*)"
                        r"(?P<arg>\[=|=)?")
# one option in --usage: "[--time-min=minutes]", "[--nice[=value]]", "[-N nnodes]", "[--hold]"
_USAGE_LONG = re.compile(r"\[--(?P<name>[A-Za-z0-9][A-Za-z0-9-]*)(?P<arg>\[=|=)?")
_USAGE_SHORT = re.compile(r"\[-(?P<short>[A-Za-z])(?P<arg> [^\]\s]+)?\]")


@dataclass(frozen=True)
class SbatchOptions:
    """The options of one sbatch: ``long_value`` take a required value, ``long_optional`` only as ``--opt=v``,
    ``long_flag`` none; ``short_value`` letters take a value; ``short_to_long`` maps letters to long names;
    ``source`` says where the table came from (a path, or ``built-in 22.05: <why>``)."""

    long_value: FrozenSet[str]
    long_optional: FrozenSet[str] = frozenset()
    long_flag: FrozenSet[str] = frozenset()
    short_value: FrozenSet[str] = BUILTIN_SHORT_VALUE
    short_to_long: Mapping[str, str] = field(default_factory=lambda: dict(BUILTIN_SHORT_TO_LONG))
    source: str = "built-in 22.05"

    def knows(self, name: str) -> bool:
        """Whether long option ``name`` (without ``--``) is one of this sbatch's."""
        return name in self.long_value or name in self.long_optional or name in self.long_flag

    def to_json(self) -> Dict[str, object]:
        return {"long_value": sorted(self.long_value), "long_optional": sorted(self.long_optional),
                "long_flag": sorted(self.long_flag), "short_value": sorted(self.short_value),
                "short_to_long": dict(self.short_to_long), "source": self.source}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> "SbatchOptions":
        """The table ``to_json`` wrote (the on-disk cache), read back.
        ValueError: a table field is not a list of strings or ``short_to_long`` is not a mapping."""
        def fs(key: str) -> FrozenSet[str]:
            v = d.get(key)
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError(key)
            return frozenset(v)

        s2l = d.get("short_to_long")
        if not isinstance(s2l, dict):
            raise ValueError("short_to_long")
        return cls(fs("long_value"), fs("long_optional"), fs("long_flag"), fs("short_value"),
                   {str(k): str(v) for k, v in s2l.items()}, str(d.get("source") or "cache"))


BUILTIN = SbatchOptions(BUILTIN_22_05)


def parse_sbatch_help(text: str, source: str = "sbatch --help") -> SbatchOptions:
    """The option table of ``sbatch --help`` and/or ``sbatch --usage`` output (both may be concatenated),
    completed with ``BUILTIN_22_05`` and ``GETOPT_REQUIRED`` (module docstring).

    A long option takes a value when it is printed ``--opt=v`` or ``--opt v``; ``--opt[=v]`` takes one only
    joined by ``=``. Raises nothing: text without options gives the built-in table."""
    value: Set[str] = set(BUILTIN_22_05)
    optional: Set[str] = set()
    flag: Set[str] = set()
    short_value, short_to_long = set(BUILTIN_SHORT_VALUE), dict(BUILTIN_SHORT_TO_LONG)

    def add(name: str, arg: Optional[str], short: Optional[str]) -> None:
        kind = "flag" if not arg else ("optional" if arg.startswith("[") else "value")
        if name in GETOPT_REQUIRED or name in BUILTIN_22_05:
            kind = "value"
        (value if kind == "value" else optional if kind == "optional" else flag).add(name)
        if short:
            short_to_long[short] = name
            (short_value.add if kind == "value" else short_value.discard)(short)

    for line in text.splitlines():
        m = _HELP_LINE.match(line)
        if m:
            add(m.group("name"), m.group("arg"), m.group("short"))
            continue
        if "[" in line:
            for u in _USAGE_LONG.finditer(line):
                add(u.group("name"), u.group("arg"), None)
            for s in _USAGE_SHORT.finditer(line):
                if s.group("arg"):
                    short_value.add(s.group("short"))
    optional -= value
    flag -= value | optional
    return SbatchOptions(frozenset(value), frozenset(optional), frozenset(flag), frozenset(short_value),
                         short_to_long, source)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "slurm-coloc" / "sbatch-options"


def _binary_key(exe: str, env: Mapping[str, str]) -> Tuple[str, str]:
    """(cache key, resolved path): the binary's real path, size and mtime, and the SLURM_CONF file it reads
    (plugstack.conf SPANK options appear in the help too). Raises OSError when the binary is missing."""
    real = os.path.realpath(exe)
    st = os.stat(real)
    conf = env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    parts = [real, str(st.st_size), str(st.st_mtime_ns), conf]
    for p in (conf, os.path.join(os.path.dirname(conf), "plugstack.conf")):
        try:
            parts.append(str(os.stat(p).st_mtime_ns))
        except OSError:
            parts.append("-")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32], real


_MEMO: Dict[str, SbatchOptions] = {}


def installed_options(bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
                      use_cache: bool = True) -> SbatchOptions:
    """``<bin_dir>/sbatch``'s option table: ``--help`` + ``--usage`` parsed once per binary and slurm.conf,
    cached in memory and ``$XDG_CACHE_HOME/slurm-coloc/sbatch-options/<key>.json`` (``use_cache`` False: run
    it again).

    Never raises: when sbatch cannot be run or prints no option, ``BUILTIN`` with ``source`` saying why."""
    full_env = dict(os.environ if env is None else env)
    exe = str(Path(bin_dir) / "sbatch")
    try:
        key, real = _binary_key(exe, full_env)
    except OSError as exc:
        return SbatchOptions(BUILTIN_22_05, source=f"built-in 22.05: {exe}: {exc.strerror}")
    if use_cache and key in _MEMO:
        return _MEMO[key]
    path = _cache_dir() / f"{key}.json"
    if use_cache:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            data = json.loads(path.read_text())
            if data.get("version") == CACHE_VERSION:
                table = SbatchOptions.from_json(data["table"])
                _MEMO[key] = table
                return table
    texts = []
    for flag in ("--help", "--usage"):
        try:
            proc = run(["sbatch", flag], bin_dir=bin_dir, env=full_env, timeout_s=HELP_TIMEOUT_S, check=False)
        except SlurmError as exc:
            return SbatchOptions(BUILTIN_22_05, source=f"built-in 22.05: {exc.one_line()}")
        if proc.returncode == 0:
            texts.append(proc.stdout)
    if not texts or "--" not in "".join(texts):
        return SbatchOptions(BUILTIN_22_05, source=f"built-in 22.05: {real} --help printed no options "
                                                   "(no slurm.conf?)")
    table = parse_sbatch_help("\n".join(texts), source=real)
    _MEMO[key] = table
    with contextlib.suppress(OSError):  # a cache we cannot write only costs the next run one sbatch --help
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": CACHE_VERSION, "table": table.to_json()}))
        os.replace(tmp, path)
    return table
