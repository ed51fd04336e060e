"""Evaluation passes in a probe: repeated no-grad forwards skipped, the eval loader's batch replayed.

* **Repeats skipped.** A top-level no-grad module call (nanoGPT's ``estimate_loss()``: 200 batches before the
  first step) with the same input shapes and dtypes as two earlier no-grad calls of that module holds the same
  memory: it returns a stand-in output of the same structure (new fake GPU tensors, their memory replayed)
  without running the module.
* **The evaluation pass after the steps.** Programs evaluate after their first epoch, long after the probe
  stops, often with a larger batch (pytorch/examples mnist: 1,000 against 64). At the end one no-grad forward
  is replayed per ``DataLoader`` whose ``batch_size`` exceeds the training batch: the training call's GPU
  inputs at that batch, the module in ``eval()``, with the last step's parameters, gradients and optimizer
  state still held (as at an epoch's end).
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

SKIP_AFTER = 2  # identical no-grad calls traced before repeats are skipped


_STAND_IN: List[Any] = []


def _stand_in(torch: Any) -> Any:
    """An autograd function making a new tensor of a given shape from a 0-dim anchor: an output that requires
    grad and is no leaf, with no memory beyond its own (a ``clone()`` of a leaf would hold two)."""
    if not _STAND_IN:
        class StandIn(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, anchor: Any, shape: Any, dtype: Any, device: Any) -> Any:  # type: ignore[override]
                return torch.empty(shape, dtype=dtype, device=device)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
                return None, None, None, None

        _STAND_IN.append(StandIn)
    return _STAND_IN[0]


class EvalPasses:
    """Skips repeated no-grad forwards and replays the evaluation batch (module docstring).

    ``train_call``: ``(module, skeleton of (args, kwargs))`` of the last top-level call with grad;
    ``loader_batches``: every DataLoader's ``batch_size``.
    """

    def __init__(self, torch: Any, on_gpu: Callable[[Any], bool]) -> None:
        self.torch = torch
        self.on_gpu = on_gpu
        self.seen: Dict[Tuple[Any, ...], int] = {}
        self.outputs: Dict[Tuple[Any, ...], Any] = {}
        self.skipped = 0
        self.train_call: Optional[Tuple[Any, Any]] = None
        self.loader_batches: List[int] = []
        self.replayed: List[int] = []
        self.smaller: Any = None  # smaller.SmallerCalls: calls no larger than the training call's

    # -- skeletons: structure, shapes and dtypes, no tensors held ------------------------------
    def skeleton(self, obj: Any) -> Optional[Tuple[Any, List[Any]]]:
        """``(pytree spec, leaves)`` of any pytree, or None if a leaf is opaque.

        Tensors become ``("t", shape, dtype, on_gpu, requires_grad)``, plain leaves (None, bool, int, float,
        str) ``("v", value)``; anything else is opaque.
        """
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten(obj)
        out: List[Any] = []
        for leaf in leaves:
            if isinstance(leaf, self.torch.Tensor):
                out.append(("t", tuple(leaf.shape), leaf.dtype, self.on_gpu(leaf), bool(leaf.requires_grad)))
            elif leaf is None or isinstance(leaf, (bool, int, float, str)):
                out.append(("v", leaf))
            else:
                return None
        return spec, out

    def rebuild(self, skel: Tuple[Any, List[Any]], batch: Optional[Tuple[int, int]] = None,
                grad: bool = False) -> Any:
        """The pytree of a :meth:`skeleton` with new tensors (GPU ones empty replayed fakes, host ones zeros).

        ``batch=(old, new)``: a dimension 0 equal to ``old`` becomes ``new``. ``grad``: floating tensors that
        required grad require it again (outputs of :func:`_stand_in`, whose graph leads to one small anchor,
        not the module).
        """
        from torch.utils._pytree import tree_unflatten

        spec, leaves = skel
        made = []
        anchor = None
        for leaf in leaves:
            if leaf[0] != "t":
                made.append(leaf[1])
                continue
            shape = list(leaf[1])
            if batch is not None and shape and shape[0] == batch[0]:
                shape[0] = batch[1]
            device = "cuda" if leaf[3] else "cpu"
            if grad and leaf[4] and leaf[2].is_floating_point:
                # not a leaf: programs scale a loss in place (``loss *= n``), which autograd refuses on a leaf
                if anchor is None:
                    anchor = self.torch.zeros((), device=device, requires_grad=True)
                made.append(_stand_in(self.torch).apply(anchor, tuple(shape), leaf[2], device))
                continue
            # a GPU stand-in has no values anyway (one fake op, not two); a host one holds real zeros
            make = self.torch.empty if leaf[3] else self.torch.zeros
            made.append(make(shape, dtype=leaf[2], device=device))
        return tree_unflatten(made, spec)

    def _key(self, mod: Any, args: Any, kwargs: Any) -> Optional[Tuple[Any, ...]]:
        skel = self.skeleton((args, kwargs))
        if skel is None:
            return None
        return (id(mod), str(skel[0]), tuple((x[0],) + tuple(str(v) for v in x[1:]) for x in skel[1]))

    # -- the module call wrapper ---------------------------------------------------------------
    def note_train_call(self, mod: Any, args: Any, kwargs: Any) -> None:
        """Remember a top-level grad-enabled call (the evaluation replay's inputs)."""
        skel = self.skeleton((args, kwargs))
        if skel is not None:
            self.train_call = (weakref.ref(mod), skel)

    def call(self, orig: Callable[..., Any], mod: Any, args: Any, kwargs: Any) -> Any:
        """``Module.__call__`` at depth 0: skip repeats under no_grad, remember training calls.

        A no-grad call of the same module and shapes seen ``SKIP_AFTER`` times gets rebuilt outputs of the
        same structure, shapes and dtypes; otherwise ``smaller.SmallerCalls`` may answer it.
        """
        if self.torch.is_grad_enabled():
            self.note_train_call(mod, args, kwargs)
            return orig(mod, *args, **kwargs)
        key = self._key(mod, args, kwargs)
        if key is None:
            return orig(mod, *args, **kwargs)
        n = self.seen.get(key, 0)
        if n >= SKIP_AFTER and key in self.outputs:
            self.skipped += 1
            return self.rebuild(self.outputs[key])
        if self.smaller is not None:
            answered, out = self.smaller.try_call(mod, args, kwargs, self.rebuild)
            if answered:
                return out
        out = orig(mod, *args, **kwargs)
        self.seen[key] = n + 1
        skel = self.skeleton(out)
        if skel is not None:
            self.outputs[key] = skel
        if self.smaller is not None:
            self.smaller.observe(mod, args, kwargs, skel)
        return out

    # -- after the steps -----------------------------------------------------------------------
    def replay_eval_batches(self, note: Callable[[str], None]) -> None:
        """One no-grad forward per loader batch size above training's; a failure is noted, not raised."""
        if self.train_call is None:
            return
        ref, skel = self.train_call
        mod = ref()
        gpu_batches = [leaf[1][0] for leaf in skel[1] if leaf[0] == "t" and leaf[3] and leaf[1]]
        if mod is None or not gpu_batches:
            return
        train_b = int(gpu_batches[0])
        for b in sorted(set(x for x in self.loader_batches if x > train_b)):
            try:
                args, kwargs = self.rebuild(skel, (train_b, b))
                was_training = mod.training
                mod.eval()
                with self.torch.no_grad():
                    mod(*args, **kwargs)
                mod.train(was_training)
                self.replayed.append(b)
            except Exception as exc:  # the figure stands without it, said so
                note(f"evaluation pass at batch {b} not replayed: {type(exc).__name__}: "
                     f"{' '.join(str(exc).split())[:120]}")
                continue
            note(f"evaluation pass replayed after the steps: one no-grad forward at the eval loader's "
                 f"batch size {b} (training batch {train_b})")

    def summary_note(self) -> str:
        """One line on skipped repeats ("" when none)."""
        if not self.skipped:
            return ""
        return (f"{self.skipped} repeated no-grad forward(s) of the same shapes skipped (evaluation loop; "
                f"their GPU memory is that of the first {SKIP_AFTER})")
