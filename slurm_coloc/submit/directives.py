"""Reading a job script: its ``#SBATCH`` options and ``#COLOC`` directives (pure, no Slurm, no torch).
``#COLOC`` lines (docs/user.md) hold ``key=value`` pairs, shell-quoted where needed::

    #COLOC model=torchvision.models:resnet18 kwarg.num_classes=10
    #COLOC input=3x32x32 batch=128 optimizer=sgd-momentum precision=amp-fp16
    #COLOC mem=6G            # override the estimate
    #COLOC share=exclusive   # ask for a whole GPU

As ``#SBATCH``, they are read only in the header (sbatch's rule: up to the first line neither blank nor a
comment); ``ParsedScript.late_coloc_lines`` lists later ones (ignored; coloc-sbatch warns).
"""
from __future__ import annotations

import ast
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from slurm_coloc.errors import ColocError, DirectiveError
from slurm_coloc.estimate.spec import OPTIMIZERS, PRECISIONS, ModelSpec
from slurm_coloc.units import parse_size_mib

MAX_SCRIPT_BYTES = 4 * 1024 * 1024  # Slurm's default max_script_size
KEYS = ("model", "input", "input-dtype", "batch", "optimizer", "precision", "mem", "share", "python")
SHARE_MODES = ("shard", "exclusive")
INPUT_DTYPES = ("float32", "int64")
PY_CONSTANTS = {"True": True, "False": False, "None": None}


@dataclass(frozen=True)
class ParsedScript:
    """A job script as coloc-sbatch sees it: ``sha256`` of its bytes (links runs of the same script for the
    history estimator); ``sbatch_lines`` ``(1-based line_no, tokens)`` of each ``#SBATCH`` line; ``coloc`` the
    merged ``#COLOC`` key/values (``kwarg.*`` in ``spec.kwargs``); ``spec`` None without ``model=``;
    ``mem_override_mib`` ``mem=`` in MiB; ``share`` ``shard`` (default) or ``exclusive``; ``text`` decoded,
    BOM removed; ``late_coloc_lines`` ``#COLOC`` lines after the header (ignored)."""

    path: Path
    sha256: str
    sbatch_lines: Tuple[Tuple[int, Tuple[str, ...]], ...]
    coloc: Dict[str, str]
    spec: Optional[ModelSpec]
    mem_override_mib: Optional[int]
    share: str
    text: str = field(repr=False, default="")
    late_coloc_lines: Tuple[int, ...] = ()


def read_script(path: str) -> Tuple[bytes, str]:
    """``(raw bytes, text)`` of a job script (at most ``MAX_SCRIPT_BYTES``, UTF-8; a BOM is dropped).

    Raises:
        DirectiveError: missing, not a regular file, unreadable, too large, binary (NUL bytes) or not UTF-8.
    """
    p = Path(path)
    if not p.exists():
        raise DirectiveError(f"job script {path!r} does not exist")
    if not p.is_file():
        raise DirectiveError(f"job script {path!r} is not a regular file")
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise DirectiveError(f"cannot read job script {path!r}: {exc.strerror or exc}") from None
    if len(raw) > MAX_SCRIPT_BYTES:
        raise DirectiveError(f"job script {path!r} is larger than {MAX_SCRIPT_BYTES} bytes (Slurm's "
                             "max_script_size)")
    if b"\0" in raw:
        raise DirectiveError(f"job script {path!r} contains NUL bytes: not a text script")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DirectiveError(f"job script {path!r} is not UTF-8 text (byte {exc.start})") from None
    return raw, text


def header_lines(text: str) -> List[Tuple[int, str]]:
    """``(1-based line_no, stripped line)`` from the top to the first non-blank, non-comment line."""
    out = []
    for no, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        out.append((no, stripped))
    return out


def _split(no: int, rest: str) -> List[str]:
    try:
        return shlex.split(rest, comments=True)
    except ValueError as exc:
        raise DirectiveError(f"line {no}: cannot split {rest.strip()!r}: {exc}") from None


def parse_coloc_pairs(lines: List[Tuple[int, str]]) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """``({key: value text}, {kwarg name: kwarg_value})`` of ``#COLOC`` lines; later lines override.
    DirectiveError: a malformed or empty directive, a line shlex cannot split, a token without ``=``, an
    unknown key, an empty value, a bad kwarg name."""
    plain: Dict[str, str] = {}
    kwargs: Dict[str, Any] = {}
    for no, line in lines:
        if not line.startswith("#COLOC"):
            continue
        rest = line[len("#COLOC"):]
        if rest and not rest[0].isspace():
            raise DirectiveError(f"line {no}: malformed directive {line!r}", hint="write '#COLOC key=value'")
        tokens = _split(no, rest)
        if not tokens:
            raise DirectiveError(f"line {no}: empty #COLOC directive")
        for tok in tokens:
            key, sep, value = tok.partition("=")
            if not sep or not key:
                raise DirectiveError(f"line {no}: #COLOC expects key=value, got {tok!r}")
            if key.startswith("kwarg."):
                name = key[len("kwarg."):]
                if not name.isidentifier():
                    raise DirectiveError(f"line {no}: kwarg name {name!r} is not a Python identifier")
                kwargs[name] = kwarg_value(value)
                continue
            if key not in KEYS:
                raise DirectiveError(f"line {no}: unknown #COLOC key {key!r}",
                                     hint=f"known keys: {', '.join(KEYS)}, kwarg.<name>")
            if not value:
                raise DirectiveError(f"line {no}: #COLOC {key}= has an empty value")
            plain[key] = value
    return plain, kwargs


def kwarg_value(text: str) -> Any:
    """A JSON-compatible ``kwarg.NAME=`` value, never raising: JSON (``10``, ``true``, ``[1,2]``, ``null``);
    else Python's ``True``, ``False``, ``None``; else a Python literal in brackets or quotes (``(3, 3)``,
    ``['a']``, ``'x'``; ``ast.literal_eval``: nothing is run) that JSON can carry (tuples become lists); else
    the text itself."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        pass
    if text in PY_CONSTANTS:
        return PY_CONSTANTS[text]
    if text[:1] in "([{'\"":
        try:
            value = ast.literal_eval(text)
            return json.loads(json.dumps(value))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return text


def parse_input_shape(text: str) -> Tuple[int, ...]:
    """``"3x32x32"``, ``"3,32,32"`` or ``"3×32×32"`` -> ``(3, 32, 32)``: one sample, no batch; each dimension
    1..1_000_000. DirectiveError: not positive integers separated by ``x`` or ``,``."""
    parts = text.lower().replace("×", "x").replace(",", "x").split("x")
    if not all(p.isdigit() and 0 < int(p) <= 1_000_000 for p in parts):
        raise DirectiveError(f"#COLOC input={text!r}: expected sizes like 3x32x32 or 3,32,32")
    return tuple(int(p) for p in parts)


def _positive_int(key: str, text: str, limit: int) -> int:
    if not text.isdigit() or not 0 < int(text) <= limit:
        raise DirectiveError(f"#COLOC {key}={text!r}: expected an integer in 1..{limit}")
    return int(text)


def build_spec(plain: Dict[str, str], kwargs: Dict[str, object], base_dir: str) -> Optional[ModelSpec]:
    """A ModelSpec from parsed pairs, or None without ``model=``. Defaults: ``optimizer`` ``adam``,
    ``precision`` ``fp32``, ``input-dtype`` ``float32``; a ``path.py:callable`` model is relative to
    ``base_dir`` (the script's directory). DirectiveError: model without input/batch, input/batch/kwarg
    without a model, bad model reference, bad optimizer/precision/dtype, batch outside 1..1_000_000."""
    model = plain.get("model")
    if model is None:
        if kwargs or any(k in plain for k in ("input", "batch")):
            raise DirectiveError("#COLOC gives input/batch/kwarg but no model=")
        return None
    ref, sep, attr = model.rpartition(":")
    if not sep or not ref or not attr.isidentifier():
        raise DirectiveError(f"#COLOC model={model!r}: expected module:callable or path.py:callable")
    missing = [k for k in ("input", "batch") if k not in plain]
    if missing:
        raise DirectiveError(f"#COLOC model={model} needs {' and '.join(missing)}=",
                             hint="e.g. '#COLOC input=3x32x32 batch=128'")
    optimizer = plain.get("optimizer", "adam").lower()
    precision = plain.get("precision", "fp32").lower()
    dtype = plain.get("input-dtype", "float32").lower()
    for key, value, choices in (("optimizer", optimizer, OPTIMIZERS), ("precision", precision, PRECISIONS),
                                ("input-dtype", dtype, INPUT_DTYPES)):
        if value not in choices:
            raise DirectiveError(f"#COLOC {key}={value!r}: choose one of {', '.join(choices)}")
    return ModelSpec(model=model, input_shape=parse_input_shape(plain["input"]),
                     batch_size=_positive_int("batch", plain["batch"], 1_000_000), kwargs=kwargs,
                     input_dtype=dtype, optimizer=optimizer, precision=precision, base_dir=base_dir)


def parse_script(path: str) -> ParsedScript:
    """Read and parse a job script (``mem=`` override in MiB).

    Raises:
        DirectiveError: see ``read_script``, ``parse_coloc_pairs`` and ``build_spec``; an ``#SBATCH`` line
            shlex cannot split; a bad ``mem=``/``share=``."""
    raw, text = read_script(path)
    header = header_lines(text)
    late = tuple(no for no, line in enumerate(text.splitlines(), start=1)
                 if no > len(header) and line.strip().startswith("#COLOC"))
    sbatch_lines = tuple((no, tuple(_split(no, line[len("#SBATCH"):])))
                         for no, line in header if line.startswith("#SBATCH") and
                         (len(line) == 7 or line[7].isspace()))
    plain, kwargs = parse_coloc_pairs(header)
    base_dir = str(Path(path).resolve().parent)
    spec = build_spec(plain, kwargs, base_dir)
    mem = None
    if "mem" in plain:
        try:
            mem = parse_size_mib(plain["mem"])
        except ColocError as exc:
            raise DirectiveError(f"#COLOC mem=: {exc.message}", hint=exc.hint) from None
    share = plain.get("share", "shard").lower()
    if share not in SHARE_MODES:
        raise DirectiveError(f"#COLOC share={share!r}: choose one of {', '.join(SHARE_MODES)}")
    return ParsedScript(path=Path(path), sha256=hashlib.sha256(raw).hexdigest(), sbatch_lines=sbatch_lines,
                        coloc=plain, spec=spec, mem_override_mib=mem, share=share, text=text,
                        late_coloc_lines=late)
