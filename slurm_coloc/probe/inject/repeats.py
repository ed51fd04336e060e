"""Repeated work in a probe answered without running it: evaluation passes and gradient-accumulation steps.

* **No-grad repeats.** A top-level no-grad module call (nanoGPT's ``estimate_loss()``: 200 batches before the
  first step) with the input shapes and dtypes of ``SKIP_AFTER`` earlier no-grad calls of that module holds
  the same memory: it returns a stand-in output (new fake GPU tensors, memory replayed) without running.
* **The evaluation pass after the steps** (pytorch/examples mnist: batch 1,000 against 64): at the end one
  no-grad forward per ``DataLoader`` whose ``batch_size`` exceeds the training batch, the training call's GPU
  inputs at that batch, the module in ``eval()``, with the last step's state held.
* **Gradient accumulation** (nanoGPT's ``train_gpt2.py``: 40 micro-steps per step): each micro-step after the
  second holds the memory the second held. Within one optimizer cycle a micro-step runs from one
  ``backward()`` to the next; when the ``SKIP_AFTER`` before it were each one top-level grad-enabled call
  with the same key (module, input structure, shapes, dtypes, ``training``, autocast) and the new one's call
  has it too, the call returns a stand-in output and its ``backward()`` does nothing. A second call inside a
  skipped micro-step stops skipping for good (noted): the probe never guesses a micro-step it has not seen
  twice. Each skipped micro-step adds the FLOPs of its cycle's second.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

SKIP_AFTER = 2  # identical no-grad calls, or one-call micro-steps of a cycle, run before repeats are skipped
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

    ``train_call``: ``(module, skeleton of (args, kwargs))`` of the last top-level call with grad.
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
        """``Module.__call__`` at depth 0: skip no-grad repeats (else ``smaller.SmallerCalls`` may answer),
        remember training calls."""
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


class MicroSteps:
    """Skips repeated grad-enabled micro-steps of one optimizer cycle (module docstring).

    ``flops_total()``: the FLOP counter's running total or None. ``extra_flops``: FLOPs credited for skipped
    micro-steps; ``broken``: a skipped micro-step turned out irregular, nothing is skipped after it.
    """

    def __init__(self, torch: Any, evals: EvalPasses, flops_total: Callable[[], Optional[int]]) -> None:
        self.torch = torch
        self.evals = evals
        self.flops_total = flops_total
        self.cycle: List[Tuple[Any, ...]] = []  # the finished micro-steps of this cycle: their call keys
        self.current: List[Any] = []  # call keys of the micro-step in progress
        self.outputs: Dict[Any, Any] = {}
        self.skipping = False
        self.skipped = 0
        self.skipped_cycle = 0
        # FLOP total at the end of each backward() of this cycle
        self.backward_flops: List[Optional[int]] = []
        self.extra_flops = 0
        self.broken = False
        self.max_k = 0

    def _key(self, mod: Any, args: Any, kwargs: Any) -> Optional[Tuple[Any, ...]]:
        key = self.evals._key(mod, args, kwargs)
        if key is None:
            return None
        torch = self.torch
        try:
            amp = (torch.is_autocast_enabled("cpu"), str(torch.get_autocast_dtype("cpu")))
        except (AttributeError, TypeError, RuntimeError):
            amp = (torch.is_autocast_enabled(), "")
        return key + (bool(mod.training), amp)

    def call(self, orig: Callable[..., Any], mod: Any, args: Any, kwargs: Any) -> Any:
        """A top-level grad-enabled module call: run ``orig``, or answer a repeated micro-step's call with a
        grad-requiring rebuilt output (its micro-step then skipped)."""
        self.evals.note_train_call(mod, args, kwargs)
        key = self._key(mod, args, kwargs)
        if self.skipping:
            # a second call in a micro-step that looked like the two before it: it is not one of them
            self.broken = True
            self.skipping = False
            self.current.append(None)
            return orig(mod, *args, **kwargs)
        if self.current or key is None or self.broken:
            self.current.append(key)
            return orig(mod, *args, **kwargs)
        self.current.append(key)
        last = self.cycle[-SKIP_AFTER:]
        if len(last) == SKIP_AFTER and all(m == (key,) for m in last) and key in self.outputs:
            self.skipping = True
            self.skipped += 1
            self.skipped_cycle += 1
            return self.evals.rebuild(self.outputs[key], grad=True)
        out = orig(mod, *args, **kwargs)
        skel = self.evals.skeleton(out)
        if skel is not None:
            self.outputs[key] = skel
        else:
            self.outputs.pop(key, None)
        return out

    def before_backward(self) -> bool:
        """True when this ``backward()`` belongs to a skipped micro-step (then it does nothing)."""
        return self.skipping

    def after_backward(self) -> None:
        self.cycle.append(tuple(self.current))
        self.current = []
        if not self.skipping:
            self.backward_flops.append(self.flops_total())
        self.skipping = False

    def on_step(self) -> None:
        """An optimizer step ends the cycle: credit the skipped micro-steps' FLOPs, start a new cycle."""
        if self.skipped_cycle:
            ff = self.backward_flops
            if len(ff) >= 2 and ff[0] is not None and ff[1] is not None:
                self.extra_flops += self.skipped_cycle * max(0, int(ff[1]) - int(ff[0]))
        if self.skipping:  # a step with no backward() after the skipped call: irregular
            self.broken = True
        self.max_k = max(self.max_k, len(self.cycle))
        self.cycle, self.current, self.backward_flops = [], [], []
        self.skipped_cycle = 0
        self.skipping = False

    def summary_note(self) -> str:
        """One line on skipped micro-steps ("" when none)."""
        out = ""
        if self.skipped:
            out = (f"gradient accumulation: {self.skipped} repeated micro-step(s) of the same shapes skipped "
                   f"(up to {self.max_k} per optimizer step; each holds the memory of the cycle's 2nd; "
                   "FLOPs scaled)")
        if self.broken:
            out += ("; " if out else "") + ("gradient accumulation: an irregular micro-step seen, "
                                            "skipping stopped")
        return out
