"""One probe per training configuration, not per submission (pure).

A sweep submits one script with arguments that change no shape, dtype, model or batch: learning rate, seed,
epochs, logging intervals, output paths. :func:`config_args` drops those options (``INERT``) and their
values from the probe cache key, so a sweep's second submission reuses the first probe; every other argument
(positional ones, ``--batch-size``, ``--arch``, ``--amp``, unknown options) keeps keys apart. Names compare
without leading dashes, lower case, ``-`` as ``_``; a value is the ``=`` part or the next word unless that is
an option (``--lr -0.1`` is a number).
"""
from __future__ import annotations

import re
from typing import List, Sequence, Tuple

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
    """``(kept, dropped)``: the program's arguments that define the training configuration (in order, the
    cache key's part), and the inert ones as written (for ``--explain``).
    """
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
