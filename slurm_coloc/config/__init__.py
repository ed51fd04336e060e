"""The one typed config of slurm-coloc: ``Config`` and its loaders (``load``, ``load_fallback``,
``load_in_job_environment``).

Precedence: defaults < YAML file < ``COLOC_<KEY>`` environment variables (upper-case key).
The file is ``$COLOC_CONFIG`` if set, else ``/etc/slurm-coloc/coloc.yaml``; a missing default
file means "all defaults", a missing ``$COLOC_CONFIG`` file is an error. Unknown keys and
bad values raise ``ConfigError`` naming the key.

The keys are flat (in YAML and as attributes: ``cfg.gpu_mem_gib``) and grouped in sections, one frozen
dataclass each (``config/sections.py``: ``SECTIONS``), which ``Config`` joins. Each key declares its valid
values beside its default (``sections._key``: bounds, choices, not empty); ``_validate`` checks those
declarations (``config/checks.py``) and the few rules between keys (``CROSS_RULES``).

The config also describes itself: ``sample_yaml`` is the commented sample (every key at its default, with
its meaning from its section's docstring; ``deploy/coloc.yaml``, which tests/test_config_doc.py keeps in
step), and ``effective_yaml`` the effective config with each value's source.
"""
from __future__ import annotations

import dataclasses
import os
import re
import textwrap
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import yaml

from slurm_coloc.config.checks import _check_key, _coerce_field
from slurm_coloc.config.checks import allowed as allowed_values
from slurm_coloc.config.sections import (
    SECTIONS,
    EstimateConfig,
    HookConfig,
    MetricsConfig,
    MpsConfig,
    PlacementConfig,
    ReportConfig,
    SamplerConfig,
    SiteConfig,
    SubmitConfig,
)
from slurm_coloc.errors import ConfigError

DEFAULT_CONFIG_PATH = "/etc/slurm-coloc/coloc.yaml"


# The bases in reverse: a dataclass lists its bases' fields from the last base to the first (SiteConfig's
# first).
@dataclass(frozen=True)
class Config(ReportConfig, PlacementConfig, MetricsConfig, SamplerConfig, MpsConfig, HookConfig,
             EstimateConfig,
             SubmitConfig, SiteConfig):
    """All settings, flat (``cfg.<key>``), from the sections of ``sections.SECTIONS``; units are in the names.
    Each key's meaning is in its section's docstring; ``coloc-admin config --sample`` prints them all."""

    def gpu_model_for(self, partition: Optional[str]) -> str:
        """The GPU model of ``partition`` (one partition name; None or unmapped: ``gpu_model``).

        Args:
            partition: one Slurm partition name, or None.

        Returns:
            The GPU model name (a key of the estimator's GPU table, e.g. ``H100``). Never raises.
        """
        return self.gpu_model_by_partition.get(partition or "", self.gpu_model)

    @property
    def ctld_db_path(self) -> Path:
        """Controller-side database (jobs, estimates, OOM events)."""
        return Path(self.state_dir) / "ctld.db"

    def node_db_path(self, node: str) -> Path:
        """Per-node database (hook rows, samples) of node ``node``.

        Args:
            node: the Slurm node name (``SLURMD_NODENAME``).

        Returns:
            ``<state_dir>/nodes/<node>.db``. Pure, never raises.
        """
        return Path(self.state_dir) / "nodes" / f"{node}.db"

    @property
    def node_db_dir(self) -> Path:
        """Directory holding every ``<node>.db`` (a shared filesystem in production)."""
        return Path(self.state_dir) / "nodes"


CROSS_RULES: Tuple[Tuple[str, Callable[[Config], bool], str], ...] = (
    ("mps_compute_mode", lambda c: c.mps_compute_mode != "exclusive-process" or c.mps_mode == "multi-user",
     "exclusive-process needs mps_mode multi-user (per-user daemons would each need their own context on the "
     "GPU)"),
    ("sampler_raw_retention_h", lambda c: c.sampler_raw_retention_h <= 24 * c.sampler_retention_days,
     "must be <= 24 x sampler_retention_days"),
    ("diag_train_waiting_cores", lambda c: c.diag_train_waiting_cores < c.diag_train_busy_cores,
     "must be < diag_train_busy_cores"),
)
"""The rules between keys: ``(key named in the error, holds(cfg), what the key must be)``."""


def _validate(cfg: Config) -> Config:
    """``cfg`` when every key holds a value its declaration allows (``_key``) and ``CROSS_RULES`` hold.

    Raises:
        ConfigError: the first key (in ``fields(Config)`` order, then the rules) whose value is not allowed.
    """
    for f in fields(Config):
        _check_key(f, getattr(cfg, f.name))
    for name, holds, must in CROSS_RULES:
        if not holds(cfg):
            raise ConfigError(f"config key {name!r}: {getattr(cfg, name)!r}: {must}")
    return cfg


def _read_file(file_path: Path) -> Dict[Any, Any]:
    """The mapping a config file holds (an empty file: none).

    Raises:
        ConfigError: unreadable, not YAML, or not a mapping (one line naming the file).
    """
    try:
        text = file_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"cannot read config file {str(file_path)!r}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(f"config file {str(file_path)!r} is not valid YAML: {reason}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(file_path)!r} must be a mapping of key: value")
    return data


def load(path: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> Config:
    """Load the config.

    Args:
        path: YAML file; default ``$COLOC_CONFIG`` or ``/etc/slurm-coloc/coloc.yaml``.
        environ: environment to read ``COLOC_*`` overrides from (default ``os.environ``).

    Returns:
        A validated ``Config``.

    Raises:
        ConfigError: unreadable or malformed file, unknown key, bad value.
    """
    env = os.environ if environ is None else environ
    explicit = path or env.get("COLOC_CONFIG")
    file_path = Path(explicit or DEFAULT_CONFIG_PATH)
    values: Dict[str, Any] = {}
    try:
        present = file_path.exists()
    except (OSError, ValueError):
        present = True  # let the read below report it
    if present or explicit:
        values.update(_read_file(file_path))
    known = {f.name: f for f in fields(Config)}
    for key in values:
        if key not in known:
            raise ConfigError(f"config file {str(file_path)!r}: unknown key {key!r}",
                              hint=f"known keys: {', '.join(sorted(known))}")
    for name in known:
        env_value = env.get(f"COLOC_{name.upper()}")
        if env_value is not None:
            values[name] = env_value
    try:
        typed = {k: _coerce_field(known[k], v) for k, v in values.items()}
        return _validate(dataclasses.replace(Config(), **typed))
    except ConfigError as exc:  # name the file, unless the bad key came from the environment
        key = exc.message.split("'")[1] if exc.message.startswith("config key '") else ""
        if not present or (key and env.get(f"COLOC_{key.upper()}") is not None):
            raise
        raise ConfigError(f"config file {str(file_path)!r}: {exc.message}", hint=exc.hint) from None


def load_fallback(path: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> Config:
    """Best effort, for hooks only, after ``load`` failed: the defaults plus every key of the file and of the
    ``COLOC_*`` variables that is valid on its own. Never raises.

    A hook uses this config only to find where to log and record the config error (``log_dir``, ``state_dir``,
    ``run_dir``), never to do its work with a config the admin did not get right.

    Args:
        path, environ: as ``load`` (the file is read with bad bytes replaced, at most 1 MB).

    Returns:
        A ``Config`` that passes ``_validate``: each key's value applied on its own, in file order, kept only
        when the config stays valid with it.
    """
    env = os.environ if environ is None else environ
    file_path = Path(path or env.get("COLOC_CONFIG") or DEFAULT_CONFIG_PATH)
    values: Dict[str, Any] = {}
    try:
        text = file_path.read_text(encoding="utf-8", errors="replace")[:1_000_000]
    except Exception:  # unreadable: defaults
        text = ""
    try:
        data = yaml.safe_load(text)
        if isinstance(data, dict):
            values.update(data)
    except Exception:  # not YAML as a whole: take the lines that are ``key: value`` on their own
        for line in text.splitlines():
            try:
                item = yaml.safe_load(line)
            except Exception:
                continue
            if isinstance(item, dict):
                values.update(item)
    known = {f.name: f for f in fields(Config)}
    for name in known:
        if env.get(f"COLOC_{name.upper()}") is not None:
            values[name] = env[f"COLOC_{name.upper()}"]
    cfg = Config()
    for key, value in values.items():
        if not isinstance(key, str) or key not in known:
            continue
        try:
            candidate = dataclasses.replace(cfg, **{key: _coerce_field(known[key], value)})
            cfg = _validate(candidate)
        except Exception:  # keep the default for this key
            continue
    return cfg


MAX_JOB_ENV_CONFIG_BYTES = 1 << 20  # a root-owned log named as COLOC_CONFIG must not hold the TaskProlog up


def load_in_job_environment(environ: Mapping[str, str]) -> Config:
    """The config of a hook that runs in the job's own environment (TaskProlog, as the job's user).

    The job's ``--export`` can set any variable there, so no ``COLOC_<KEY>`` override is taken
    (``COLOC_RUN_DIR`` would move the env file the TaskProlog reads), and ``COLOC_CONFIG`` only when it names
    a regular file owned by root and writable by no one else that loads; otherwise ``DEFAULT_CONFIG_PATH``.

    Args:
        environ: the job's environment (only ``COLOC_CONFIG`` is read from it).

    Raises:
        ConfigError: neither loads (the error of the named root-owned file where there is one).
    """
    named = environ.get("COLOC_CONFIG")
    if named:
        try:
            st = os.stat(named)
            trusted = st.st_uid == 0 and not st.st_mode & 0o022 and Path(named).is_file() and \
                st.st_size <= MAX_JOB_ENV_CONFIG_BYTES
        except (OSError, ValueError):
            trusted = False
        if trusted:
            try:
                return load(named, environ={})
            except ConfigError as exc:
                if named == DEFAULT_CONFIG_PATH:
                    raise
                try:
                    return load(DEFAULT_CONFIG_PATH, environ={})
                except ConfigError:
                    raise exc from None  # the admin's file is the one to fix
    return load(DEFAULT_CONFIG_PATH, environ={})


HEADER = """\
# slurm-coloc configuration: /etc/slurm-coloc/coloc.yaml
# Generated from slurm_coloc/config/ (`coloc-admin config --sample`); every key is listed, commented out, at
# its default. Uncomment a key to change it. Precedence: defaults < this file (or $COLOC_CONFIG) < COLOC_<KEY>
# environment variables. Unknown keys are errors. `coloc-admin config` prints the effective values and where
# each comes from; `coloc-admin check` checks them against slurm.conf and gres.conf.
"""


def _descriptions(section: type) -> List[Tuple[List[str], str]]:
    """``[(names, text)]`` from the ``Attributes:`` of a section's docstring, in order (``diag_*`` stays a
    pattern)."""
    doc = section.__doc__ or ""
    body = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    entries: List[Tuple[List[str], str]] = []
    for line in body.splitlines():
        m = re.match(r"^        ([a-z_*, ]+?):\s(.*)$", line)
        if m:
            entries.append(([n.strip() for n in m.group(1).split(",")], m.group(2).strip()))
        elif entries and line.strip():
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
    return entries


def _entry_of(name: str, entries: List[Tuple[List[str], str]]) -> int:
    """Index of the docstring entry describing key ``name`` (-1: none)."""
    for i, (names, _) in enumerate(entries):
        if any(n == name or (n.endswith("*") and name.startswith(n[:-1])) for n in names):
            return i
    return -1


def _item(name: str, value: object) -> str:
    """``name: value``, the value in YAML flow style (``{}`` for an empty mapping, ``''`` for "")."""
    text = yaml.safe_dump({name: value}, default_flow_style=True, width=1000).strip()
    return text[1:-1].strip()  # without the braces of the one-item mapping


def _comment(text: str) -> List[str]:
    """``text`` as comment lines of at most 110 characters (``code`` quoted once)."""
    return ["# " + line for line in textwrap.wrap(text.replace("``", "`"), 108, break_on_hyphens=False)]


def sample_yaml() -> str:
    """The sample config: for each section of ``SECTIONS`` its title, then every key it declares commented out
    at its default, after its description (once for a group described together, e.g. ``diag_*``) and
    followed by the values it allows."""
    defaults = Config()
    out = [HEADER.rstrip("\n")]
    for section in SECTIONS:
        title = (section.__doc__ or section.__name__).strip().splitlines()[0]
        out.extend(["", "# " + "=" * 108, *_comment(title), "# " + "=" * 108])
        entries = _descriptions(section)
        last = -2
        for f in fields(section):
            i = _entry_of(f.name, entries)
            if i != last or i == -1:
                out.append("")
                out.extend(_comment(entries[i][1] if i >= 0 else "(no description)"))
            last = i
            allowed = allowed_values(f)
            out.append("#" + _item(f.name, getattr(defaults, f.name)) + (f"  # {allowed}" if allowed else ""))
    return "\n".join(out) + "\n"


def config_path(path: Optional[str], environ: Mapping[str, str]) -> Tuple[Path, bool]:
    """``(file, named)``: the file ``load`` reads; named by ``path`` or ``$COLOC_CONFIG``."""
    explicit = path or environ.get("COLOC_CONFIG")
    return Path(explicit or DEFAULT_CONFIG_PATH), bool(explicit)


def effective_yaml(path: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> str:
    """The effective config as YAML: a header naming the file (``not present: defaults`` for a missing
    default file), then every key with its source (the file, ``env COLOC_<KEY>`` or ``default``).

    Raises:
        ConfigError: as ``load`` (unreadable or malformed file, unknown key, bad value).
    """
    env = os.environ if environ is None else environ
    cfg = load(path, env)
    file, _ = config_path(path, env)
    read = file.exists()
    in_file: Dict[str, Any] = (yaml.safe_load(file.read_text(encoding="utf-8")) or {}) if read else {}
    note = "" if read else " (not present: defaults)"
    lines = [f"# effective slurm-coloc configuration; file: {file}{note}"]
    for f in fields(Config):
        var = f"COLOC_{f.name.upper()}"
        src = f"env {var}" if env.get(var) is not None else str(file) if f.name in in_file else "default"
        lines.append(f"{_item(f.name, getattr(cfg, f.name))}  # {src}")
    return "\n".join(lines) + "\n"
