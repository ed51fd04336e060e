"""Find the training command of a batch script (pure: text in, typed command out).

Recognised on the lines that run Python (``\\`` continuations joined); with several, the first whose program
reads like training (``.backward(``, ``.step(``, ``torch.optim``, ``Trainer(``, ``.fit(``, ``train(``), else
the first (``python prepare.py`` then ``python train.py`` probes ``train.py``; only that command runs):

* ``python``/``python3``/``python3.X``/``/path/to/python`` ``[opts] file.py args`` or ``-m pkg args``;
* that line behind ``srun [opts]``, ``exec``, ``time``, ``nohup``, ``env``, ``VAR=value`` prefixes;
* ``torchrun``/``python -m torch.distributed.run|launch`` with one process (``--nproc_per_node``,
  ``--nproc-per-node``; more: no command, the multi-GPU rule applies);
* ``accelerate launch`` with one process (``--num_processes``; ``--multi_gpu`` or more: none); its
  ``--mixed_precision`` becomes ``ACCELERATE_MIXED_PRECISION``.

The interpreter as the text says it: ``#COLOC python=PATH``; else a path the command names; else the venv a
``source DIR/bin/activate`` (or ``.``) line activated; else the bare name, or None for a launcher's own.
``discover.py`` then looks the name up on the PATH the preamble leaves. Substituted: variables set before the
command (``X=value``, ``export X=value``), the submitting environment's (sbatch exports it by default),
``${X:-default}``, ``$1``..``$9``, ``$@``, ``$*`` and ``$SLURM_SUBMIT_DIR``; ``cd DIR`` moves the working
directory. Redirections, pipes and anything after ``;``/``&&`` are dropped.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.probe.words import logical_lines, simple_commands, words_to_operator

_PY_RE = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?$")
_PREFIXES = {"exec", "time", "nohup", "command", "builtin"}
_PY_FLAGS_WITH_ARG = {"-W", "-X", "-Q"}
_SRUN_FLAGS_NO_ARG = {"--exclusive", "--overlap", "-l", "--label", "-u", "--unbuffered", "--pty",
                      "--mpi=none", "-Q", "--quiet", "-v", "--verbose", "-K", "--kill-on-bad-exit"}
_ACC_FLAGS_NO_ARG = {"--multi_gpu", "--multi-gpu", "--cpu", "--use_deepspeed", "--use_fsdp", "--debug",
                     "--quiet", "-q", "--no_python", "--use_cpu", "--tpu", "--dynamo_use_fullgraph"}
_TORCHRUN_NO_ARG = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path"}
_ASSIGN_RE = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


@dataclass(frozen=True)
class ProbeCommand:
    """The training program a batch script runs.

    ``mode``: ``file`` or ``module`` (``-m``); ``target``: the file's absolute path or the module name;
    ``interpreter``: an absolute path or a bare name looked up on PATH, None for a launcher's own Python;
    ``workdir``: absolute; ``env``: variables the launcher or script set; ``launcher``: ``python``, ``srun``,
    ``torchrun`` or ``accelerate``; ``line``: as written, continuations joined; ``line_index``: among
    ``words.logical_lines``, the lines before it being the preamble; ``python_from``: ``coloc`` (``#COLOC
    python=``), ``path``, ``venv`` (a ``source .../activate`` line), ``bare`` or ``launcher``;
    ``python_word``: the interpreter word as written (``python3``), or the launcher's.
    """

    mode: str
    target: str
    args: Tuple[str, ...]
    interpreter: Optional[str]
    workdir: str
    env: Tuple[Tuple[str, str], ...] = ()
    launcher: str = "python"
    line: str = ""
    line_index: int = -1
    python_from: str = ""
    python_word: str = ""


@dataclass(frozen=True)
class CommandSearch:
    """:func:`find_command`'s answer: the command, or None and the reason none was found."""

    command: Optional[ProbeCommand]
    reason: str = ""
    notes: Tuple[str, ...] = field(default_factory=tuple)


def _strip_prefixes(toks: List[str], env: Dict[str, str]) -> Tuple[List[str], bool]:
    """Drop ``srun [opts]``, ``exec``, ``env``, ``VAR=value``; return the rest and whether srun was seen."""
    srun = False
    i = 0
    while i < len(toks):
        t = toks[i]
        m = _ASSIGN_RE.match(t)
        if m and "=" in t and not t.startswith("-"):
            env[m.group(1)] = m.group(2)
            i += 1
        elif t in _PREFIXES or t == "env":
            i += 1
        elif os.path.basename(t) == "srun":
            srun = True
            i += 1
            while i < len(toks) and toks[i].startswith("-"):
                flag = toks[i]
                i += 1
                if "=" not in flag and flag not in _SRUN_FLAGS_NO_ARG and i < len(toks):
                    i += 1
        else:
            break
    return toks[i:], srun


def _python_argv(toks: List[str]) -> Tuple[Optional[str], Optional[str], List[str], str]:
    """``(mode, target, args, reason)`` from the words after ``python``."""
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "-m":
            if i + 1 >= len(toks):
                return None, None, [], "python -m without a module"
            return "module", toks[i + 1], toks[i + 2:], ""
        if t.startswith("-m") and len(t) > 2:
            return "module", t[2:], toks[i + 1:], ""
        if t == "-c" or t.startswith("-c"):
            return None, None, [], "python -c runs inline code, not a program file"
        if t == "-":
            return None, None, [], "python reads its program from stdin"
        if t in _PY_FLAGS_WITH_ARG:
            i += 2
            continue
        if t.startswith("-"):
            i += 1
            continue
        return "file", t, toks[i + 1:], ""
    return None, None, [], "python without a program (interactive)"


def _nproc(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 2 if value in ("gpu", "auto") else 1


def _launcher_script(toks: List[str], kind: str, env: Dict[str, str]) -> Tuple[List[str], str]:
    """Strip ``torchrun``/``accelerate launch`` options; returns ``(python-like words, reason)``."""
    i = 0
    procs = 1
    module = False
    no_arg = _TORCHRUN_NO_ARG if kind == "torchrun" else _ACC_FLAGS_NO_ARG
    while i < len(toks) and toks[i].startswith("-"):
        flag, _, val = toks[i].partition("=")
        i += 1
        if flag in ("-m", "--module"):
            module = True
            continue
        if flag in ("--multi_gpu", "--multi-gpu"):
            procs = max(procs, 2)
        if flag in no_arg:
            continue
        if not val and i < len(toks):
            val = toks[i]
            i += 1
        if flag in ("--nproc_per_node", "--nproc-per-node", "--num_processes", "--num-processes"):
            procs = _nproc(val)
        elif flag in ("--nnodes",) and val not in ("1", "1:1"):
            return [], f"{kind} on {val} nodes: the multi-GPU rule applies"
        elif flag in ("--mixed_precision", "--mixed-precision"):
            env["ACCELERATE_MIXED_PRECISION"] = val
    if procs > 1:
        return [], f"{kind} with {procs} processes: the multi-GPU rule applies"
    rest = toks[i:]
    if module:
        rest = ["-m"] + rest
    if kind == "torchrun":
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="probe")
    return rest, ""


def find_command(text: str, script_args: Sequence[str] = (), submit_dir: str = ".",
                 environ: Optional[Mapping[str, str]] = None) -> CommandSearch:
    """The training command in ``text`` (``script_args``: ``$1``, ``$@``), or None and a reason line."""
    submit_dir = os.path.abspath(submit_dir)
    walk = _Walk(submit_dir, os.environ if environ is None else environ)
    lines = logical_lines(text)
    walk.coloc_python = _coloc_python(lines, submit_dir)
    found_all: List[CommandSearch] = []
    for index, line in enumerate(lines):
        s = line.strip()
        walk.index = index
        if not s or s.startswith("#"):
            continue
        m = _ASSIGN_RE.match(s)
        if m and " " not in m.group(2).strip().strip("\"'") and not s.startswith("export -"):
            val = words_to_operator(m.group(2), walk.vars, script_args) if m.group(2) else [""]
            walk.vars[m.group(1)] = val[0] if val else ""
            continue
        for toks in simple_commands(s, walk.vars, script_args):
            found = walk.command(toks, s)
            if found is not None:
                found_all.append(found)
    return _pick(found_all)


def _coloc_python(lines: Sequence[str], submit_dir: str) -> Optional[str]:
    """The interpreter the last ``#COLOC python=PATH`` line names (relative to ``submit_dir``), or None."""
    python: Optional[str] = None
    for line in lines:
        if line.strip().startswith("#COLOC"):
            try:
                words = shlex.split(line.strip()[len("#COLOC"):], comments=True)
            except ValueError:
                continue
            for tok in words:
                if tok.startswith("python="):
                    python = os.path.join(submit_dir, os.path.expanduser(tok.split("=", 1)[1]))
    return python


def _pick(found_all: List[CommandSearch]) -> CommandSearch:
    """The answer among the Python commands found, in script order: the only one, else the first runnable
    one whose program reads like training (``_looks_like_training``), else the first; a note says which
    was picked of several."""
    if not found_all:
        return CommandSearch(None, "no python/torchrun/accelerate command found in the script")
    runnable = [f for f in found_all if f.command is not None]
    if len(found_all) == 1 or not runnable:
        return found_all[0]
    training = [f for f in runnable if _looks_like_training(f.command)]
    pick = training[0] if training else found_all[0]
    if pick.command is None:
        return pick
    why = "the first whose program trains" if training else "the first (none reads like training)"
    note = f"{len(found_all)} Python commands in the script; probed {why}: {pick.command.line}"
    return CommandSearch(pick.command, pick.reason, pick.notes + (note,))


_TRAINING_MARKERS = (".backward(", ".step(", "torch.optim", "Trainer(", ".fit(", "train(")


def _looks_like_training(cmd: Optional[ProbeCommand]) -> bool:
    """Whether the program file's text has a training marker (``_TRAINING_MARKERS``); modules: no."""
    if cmd is None or cmd.mode != "file":
        return False
    try:
        with open(cmd.target, encoding="utf-8", errors="replace") as fh:
            text = fh.read(1_000_000)
    except OSError:
        return False
    return any(m in text for m in _TRAINING_MARKERS)


class _Walk:
    """The state of the script read so far: variables, working directory, activated venv."""

    def __init__(self, submit_dir: str, environ: Mapping[str, str]) -> None:
        self.vars: Dict[str, str] = {**environ, "SLURM_SUBMIT_DIR": submit_dir, "PWD": submit_dir}
        self.cwd = submit_dir
        self.venv_python: Optional[str] = None
        self.coloc_python: Optional[str] = None
        self.index = -1

    def _path(self, p: str) -> str:
        return os.path.normpath(os.path.join(self.cwd, os.path.expanduser(p)))

    def command(self, toks: List[str], line: str) -> Optional[CommandSearch]:
        """The search's answer when ``toks`` (non-empty, substituted shell words) runs Python; None to read
        on.

        ``cd`` and ``source .../activate`` update the walk's working directory and venv Python. The answer
        holds the ``ProbeCommand``, or None and why the launcher's options or Python's arguments rule the
        probe out.
        """
        if toks[0] == "cd" and len(toks) > 1:
            self.cwd = self._path(toks[1])
            return None
        if toks[0] in ("source", ".") and len(toks) > 1 and toks[1].endswith("/activate"):
            self.venv_python = os.path.join(os.path.dirname(self._path(toks[1])), "python")
            return None
        env: Dict[str, str] = {}
        words, srun = _strip_prefixes(toks, env)
        if not words:
            return None
        launch = _python_launch(words, "srun" if srun else "python", env)
        if launch is None:
            return None
        launcher, interp, pywords, reason = launch
        if reason:
            return CommandSearch(None, reason)
        mode, target, args, reason = _python_argv(pywords)
        if mode is None or target is None:
            return CommandSearch(None, reason)
        if mode == "file":
            target = self._path(target)
        python, source, word = self._interpreter(interp, words[0])
        return CommandSearch(ProbeCommand(
            mode=mode, target=target, args=tuple(args), interpreter=python, workdir=self.cwd,
            env=tuple(sorted(env.items())), launcher=launcher, line=" ".join(line.split()),
            line_index=self.index, python_from=source, python_word=word))

    def _interpreter(self, interp: Optional[str], first_word: str) -> Tuple[Optional[str], str, str]:
        """The Python a command runs under (``#COLOC python=``, else the activated venv's for a bare name or
        none, else the one named), where it came from (``ProbeCommand.python_from``) and the word naming it
        (``interp``, a path made absolute, else the command's ``first_word``)."""
        if interp is not None and "/" in interp:
            interp = self._path(interp)
        bare = interp is not None and "/" not in interp
        python = self.coloc_python or (self.venv_python if bare or interp is None else None) or interp
        source = ("coloc" if self.coloc_python else "venv" if python and python == self.venv_python
                  else "bare" if bare else "path" if interp else "launcher")
        return python, source, interp if interp is not None else first_word


def _python_launch(words: List[str], launcher: str,
                   env: Dict[str, str]) -> Optional[Tuple[str, Optional[str], List[str], str]]:
    """How command ``words`` starts Python: ``(launcher, interpreter word or None, Python's arguments,
    reason)``, the reason non-empty when the launcher's options rule the probe out; None when the command
    does not run Python. ``launcher`` is the command's own (``srun`` or ``python``) unless torchrun or
    ``accelerate launch`` starts it; their variables are added to ``env``."""
    head = os.path.basename(words[0])
    if head == "torchrun" or (head == "accelerate" and words[1:2] == ["launch"]):
        kind = "torchrun" if head == "torchrun" else "accelerate"
        rest, reason = _launcher_script(words[1:] if kind == "torchrun" else words[2:], kind, env)
        if reason:
            return kind, None, [], reason
        if rest and rest[0] != "-m" and _PY_RE.match(os.path.basename(rest[0])):
            return kind, rest[0], rest[1:], ""
        return kind, None, rest, ""
    if not _PY_RE.match(head):
        return None
    pywords = words[1:]
    if pywords[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
        rest, reason = _launcher_script(pywords[2:], "torchrun", env)
        return "torchrun", words[0], rest, reason
    return launcher, words[0], pywords, ""
