"""Keep training frameworks from saving checkpoints and logs during a probe (job's Python, stdlib only).

A post-import hook (:class:`_AfterImport`, first on ``sys.meta_path``) patches a framework's
module right after the program imports it, so frameworks the program never imports cost nothing:

* PyTorch Lightning (``lightning.pytorch`` and ``pytorch_lightning``): ``Trainer(...)`` gets
  ``logger=False``, ``enable_checkpointing=False``, ``enable_progress_bar=False``, no
  checkpoint callback and no ``...Monitor`` callback (they need a logger);
* Hugging Face ``TrainingArguments``: ``save_strategy="no"``, ``report_to="none"``,
  ``push_to_hub=False``; ``Trainer.save_model``/``save_state``/``_save_checkpoint`` do nothing;
* ``accelerate.Accelerator``: ``save_state``, ``save``, ``save_model`` and ``init_trackers`` do nothing.

Each patch is guarded: a framework version without the patched name is left as it is, with a note.
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable, Dict, Optional

Note = Callable[[str], None]


def _saves(callback: Any) -> bool:
    """Checkpoint callbacks (which save) and monitors (which need a logger) are left out."""
    name = type(callback).__name__
    return "Checkpoint" in name or name.endswith("Monitor")


def _lightning_trainer(mod: Any, note: Note) -> None:
    trainer = getattr(mod, "Trainer", None)
    if trainer is None:
        return
    orig = trainer.__init__

    def __init__(self: Any, *a: Any, **k: Any) -> None:
        cbs = k.get("callbacks")
        if cbs is not None:
            one = not isinstance(cbs, (list, tuple))
            k["callbacks"] = [c for c in ([cbs] if one else cbs) if not _saves(c)]
        k.update(logger=False, enable_checkpointing=False, enable_progress_bar=False)
        note("Lightning Trainer: loggers, checkpointing and progress bar off")
        orig(self, *a, **k)

    trainer.__init__ = __init__


def _hf_training_args(mod: Any, note: Note) -> None:
    args_cls = getattr(mod, "TrainingArguments", None)
    post = getattr(args_cls, "__post_init__", None)
    if args_cls is None or post is None:
        return

    def __post_init__(self: Any) -> None:
        for name, value in (("save_strategy", "no"), ("report_to", "none"), ("push_to_hub", False),
                            ("load_best_model_at_end", False)):
            if hasattr(self, name):
                setattr(self, name, value)
        note("Hugging Face TrainingArguments: save_strategy=no, report_to=none")
        post(self)

    args_cls.__post_init__ = __post_init__


def _hf_trainer(mod: Any, note: Note) -> None:
    trainer = getattr(mod, "Trainer", None)
    for name in ("save_model", "save_state", "_save_checkpoint", "push_to_hub", "create_model_card"):
        if trainer is not None and hasattr(trainer, name):
            setattr(trainer, name, _skip(f"Hugging Face Trainer.{name}", note))


def _accelerate(mod: Any, note: Note) -> None:
    acc = getattr(mod, "Accelerator", None)
    for name in ("save_state", "save", "save_model", "init_trackers"):
        if acc is not None and hasattr(acc, name):
            setattr(acc, name, _skip(f"accelerate Accelerator.{name}", note))


def _skip(what: str, note: Note) -> Callable[..., None]:
    def skipped(*a: Any, **k: Any) -> None:
        note(f"{what} skipped")

    return skipped


PATCHES: Dict[str, Callable[[Any, Note], None]] = {
    "lightning.pytorch.trainer.trainer": _lightning_trainer,
    "pytorch_lightning.trainer.trainer": _lightning_trainer,
    "transformers.training_args": _hf_training_args,
    "transformers.trainer": _hf_trainer,
    "accelerate.accelerator": _accelerate,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of a module in ``PATCHES`` to patch it once executed."""

    def __init__(self, note: Note) -> None:
        self.note = note
        self.busy: set = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Optional[Any]:
        """The module's own spec with its loader wrapped to apply ``PATCHES[name]`` after it runs; None for
        others.

        ``path`` is unused (the real finders search); a patch that fails is noted, never raised.
        """
        if name not in PATCHES or name in self.busy:
            return None
        self.busy.add(name)
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader, patch, note = spec.loader, PATCHES[name], self.note

        class _Patched(importlib.abc.Loader):
            def create_module(self, s: Any) -> Any:
                return loader.create_module(s)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                try:
                    patch(module, note)
                except Exception as exc:  # another version of the framework
                    note(f"{name}: not patched ({type(exc).__name__}: {exc})")

        spec.loader = _Patched()
        return spec


def install(note: Note) -> None:
    """Patch frameworks imported now and later (module docstring); a failing patch is noted."""
    for name, patch in PATCHES.items():
        mod = sys.modules.get(name)
        if mod is not None:
            try:
                patch(mod, note)
            except Exception as exc:  # another version of the framework
                note(f"{name}: not patched ({type(exc).__name__}: {exc})")
    sys.meta_path.insert(0, _AfterImport(note))
