"""Words of a batch script and of its program's arguments (pure).

Shell words: logical lines join ``\\`` continuations; substitution replaces ``$X``/``${X}`` (``${X:-default}``
with the default substituted in turn), ``$1``..``$9``, ``$@``, ``$*`` and ``$#`` from given variables and
script arguments; a line is split into its simple commands (:func:`simple_commands`) or read up to its first
operator (:func:`words_to_operator`), pipes and redirections cut off. Used by ``command.py`` and
``preamble.py``.

Sweeps: one probe per training configuration, not per submission. :func:`config_args` drops from the probe
cache key the options in ``INERT`` (learning rate, seed, epochs, logging intervals, output paths: no shape,
dtype, model or batch) and their values; every other argument keeps keys apart. Names compare without
leading dashes, lower case, ``-`` as ``_``; a value is the ``=`` part or the next word unless that is an
option (``--lr -0.1`` is a number).
"""
from __future__ import annotations

import re
import shlex
from typing import List, Mapping, Optional, Sequence, Tuple

_STOP_TOKENS = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>>", "&>", "<", "2>&1", "1>&2"}
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9@*#])(?::?-([^}]*))?\}"
                     r"|\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#])")


def logical_lines(text: str) -> List[str]:
    """The script's logical lines: a line ending in ``\\`` joins the next (the backslash becomes a space)."""
    out: List[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append(buf + line)
        buf = ""
    if buf:
        out.append(buf)
    return out


def _subst(s: str, vars_: Mapping[str, str], args: Sequence[str]) -> str:
    def rep(m: "re.Match[str]") -> str:
        name = m.group(1) or m.group(3)
        default = m.group(2)
        if name in ("@", "*"):
            return " ".join(shlex.quote(a) for a in args)
        if name == "#":
            return str(len(args))
        if name.isdigit():
            i = int(name)
            val = args[i - 1] if 0 < i <= len(args) else ""
        else:
            val = vars_.get(name, "")
        return val if val or default is None else _subst(default, vars_, args)

    return _VAR_RE.sub(rep, s)


def _tokens(line: str, vars_: Mapping[str, str], args: Sequence[str]) -> Optional[List[str]]:
    """Shell words and operators of ``line`` after substitution (``"$@"`` first: each argument one word);
    None when its quoting is broken."""
    quoted_all = " ".join(shlex.quote(a) for a in args)
    line = line.replace('"$@"', quoted_all).replace('"${@}"', quoted_all)
    try:
        lex = shlex.shlex(_subst(line, vars_, args), posix=True, punctuation_chars="|&;<>")
        lex.whitespace_split = True
        lex.commenters = "#"
        return list(lex)
    except ValueError:
        return None


def simple_commands(line: str, vars_: Mapping[str, str], args: Sequence[str]) -> List[List[str]]:
    """The simple commands of a line (split at ``&&``, ``||``, ``;``) as words, each cut at a pipe or
    redirection; [] for a line the reader cannot split."""
    toks = _tokens(line, vars_, args)
    if toks is None:
        return []
    segs: List[List[str]] = [[]]
    cut = False
    for t in toks:
        if t in ("&&", "||", ";", "&"):
            segs.append([])
            cut = False
        elif cut or t in _STOP_TOKENS or t.startswith((">", "2>", "&>", "|", "<")):
            cut = True
        else:
            segs[-1].append(t)
    return [seg for seg in segs if seg]


def words_to_operator(line: str, vars_: Mapping[str, str], args: Sequence[str]) -> Optional[List[str]]:
    """A line's words up to its first operator, pipe or redirection, substituted; None if unsplittable."""
    toks = _tokens(line, vars_, args)
    if toks is None:
        return None
    out = []
    for t in toks:
        if t in _STOP_TOKENS or t.startswith((">", "2>", "&>", "|", ";", "&")):
            break
        out.append(t)
    return out


INERT = frozenset({
    # optimiser hyperparameters: values only, no state shape
    "lr", "learning_rate", "base_lr", "blr", "min_lr", "max_lr", "lr_g", "lr_d", "momentum", "weight_decay",
    "wd", "beta1", "beta2", "b1", "b2", "eps", "adam_eps", "gamma", "lr_gamma", "step_size", "lr_step_size",
    "lr_decay", "lr_decay_rate", "warmup", "warmup_epochs", "warmup_steps", "warmup_iters", "label_smoothing",
    "clip_grad", "grad_clip", "clip_grad_norm", "max_grad_norm",
    # how long and how often: the step is the same
    "seed", "random_seed", "manual_seed", "epochs", "n_epochs", "num_epochs", "max_epochs", "epoch",
    "start_epoch", "max_steps", "max_iters", "num_train_epochs", "print_freq", "log_interval", "log_every",
    "log_freq", "save_every", "save_freq", "save_interval", "eval_interval", "eval_every", "eval_freq",
    "checkpoint_interval", "sample_interval", "val_interval", "patience",
    # where results go and what the run is called
    "output_dir", "out_dir", "output", "outdir", "save_dir", "save_path", "log_dir", "logdir",
    "checkpoint_dir", "ckpt_dir", "run_name", "exp_name", "experiment_name", "wandb_project",
    "wandb_run_name",
    "wandb_entity", "tag", "tags", "notes", "dist_url", "master_port", "port",
})
_NUMBER = re.compile(r"^-?(\d+\.?\d*|\.\d+)([eE]-?\d+)?$")


def option_name(word: str) -> str:
    """``--learning-rate=0.1`` -> ``learning_rate``; "" for a word that is no option."""
    if not word.startswith("-") or _NUMBER.match(word) or word in ("-", "--"):
        return ""
    return word.lstrip("-").split("=", 1)[0].lower().replace("-", "_")


def config_args(args: Sequence[str]) -> Tuple[List[str], List[str]]:
    """``(kept, dropped)``: the arguments that define the training configuration (the cache key's part), and
    the inert ones as written (for ``--explain``)."""
    kept: List[str] = []
    dropped: List[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        name = option_name(word)
        if name in INERT:
            if "=" in word or i + 1 >= len(args) or (option_name(args[i + 1]) and args[i + 1] != "--"):
                dropped.append(word)
                i += 1
                continue
            dropped.extend([word, args[i + 1]])
            i += 2
            continue
        kept.append(word)
        i += 1
    return kept, dropped


def differs_only_in(earlier: Sequence[str], now: Sequence[str]) -> str:
    """How ``now``'s inert arguments differ from ``earlier``'s (``--lr 0.1 -> --lr 0.01``); "" if same."""
    if list(earlier) == list(now):
        return ""
    before = " ".join(config_args(earlier)[1]) or "none"
    after = " ".join(config_args(now)[1]) or "none"
    return f"{before} -> {after}"
