"""No-grad forwards no larger than the training call (generation loops), answered without tracing.

An autoregressive sampling loop (minGPT's ``generate``: 500 no-grad forwards of 13 to 128 tokens at batch 1)
gives a new input shape almost every call, so ``repeats.py``'s skipping does not apply, and tracing each call
took most of the probe's time. A no-grad top-level call is answered without running when it is *dominated*
by the module's last training call (every argument bound to a ``forward`` parameter a tensor of the same
dtype, device and rank no larger in any dimension, None/left out, or the same plain value) and its output
shapes follow from two or more traced no-grad calls of the same module and input structure (each output
dimension one constant, or one input dimension, in all of them; minGPT: logits ``(1, t, 65)`` for ``idx``
``(1, t)``). Otherwise the call is traced.

The output is new fake GPU tensors (memory replayed). The call's working memory is bounded, not traced: at
most the training forward's transient (peak allocated during a grad-enabled forward above what was allocated
at its start) on top of what is allocated at the call; :meth:`SmallerCalls.settle` raises the replayed peak
to a higher bound, in a note. Assumption (docs/user.md): a no-grad forward of inputs no larger than the
training call's needs no more memory than the training forward did.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

_ABSENT = object()
_PLAIN = (bool, int, float, str)
BLOCK_B = 2 << 20  # the allocator's large-segment rounding (estimate/tracker.py)


class SmallerCalls:
    """Dominated no-grad calls answered with learned output shapes, their memory bounded (module docstring).

    ``alloc`` is the tracker's ``CachingAllocatorModel`` (bytes); ``bound_b``: the largest bound (bytes
    allocated) of a skipped call.
    """

    def __init__(self, torch: Any, on_gpu: Callable[[Any], bool], alloc: Any) -> None:
        self.torch = torch
        self.on_gpu = on_gpu
        self.alloc = alloc
        self.train: Dict[int, Tuple[Any, Dict[str, Any]]] = {}
        self.transient_b: Dict[int, int] = {}
        self.pending_b: Dict[int, int] = {}  # module -> the most allocated at one of its skipped calls
        self.observed: Dict[Any, List[Tuple[List[int], Any]]] = {}
        self.sigs: Dict[type, Any] = {}
        self.skipped = 0
        self.bound_b = 0

    # -- training calls: what they took and how much memory their forward held ---------------
    def train_call(self, run: Callable[[], Any], mod: Any, args: Any, kwargs: Any,
                   stand_in: Callable[[], bool] = lambda: False) -> Any:
        """Run a top-level grad-enabled call (``run()``), recording its bound arguments and transient (bytes,
        the latest call's); ``stand_in()`` tells a call answered without running (``repeats.MicroSteps``)."""
        bound = self._bind(mod, args, kwargs)
        if bound is not None:
            self.train[id(mod)] = (weakref.ref(mod), {k: self._describe(v) for k, v in bound.items()})
        a = self.alloc
        start, prev_peak = a.allocated_b, a.peak_allocated_b
        a.peak_allocated_b = start
        try:
            return run()
        finally:
            transient = a.peak_allocated_b - start
            a.peak_allocated_b = max(prev_peak, a.peak_allocated_b)
            if not stand_in() or id(mod) not in self.transient_b:
                self.transient_b[id(mod)] = transient

    def _bind(self, mod: Any, args: Any, kwargs: Any) -> Optional[Dict[str, Any]]:
        t = type(mod)
        if t not in self.sigs:
            try:
                self.sigs[t] = inspect.signature(mod.forward)
            except (TypeError, ValueError):
                self.sigs[t] = None
        sig = self.sigs[t]
        if sig is None:
            return None
        try:
            return dict(sig.bind(*args, **kwargs).arguments)
        except TypeError:
            return None

    def _describe(self, v: Any) -> Any:
        torch = self.torch
        if isinstance(v, torch.Tensor):
            return ("t", tuple(v.shape), v.dtype, self.on_gpu(v))
        if v is None or isinstance(v, _PLAIN):
            return ("v", v)
        return ("o", None)  # anything else is never compared equal

    def _dominated(self, mod: Any, args: Any, kwargs: Any) -> bool:
        rec = self.train.get(id(mod))
        if rec is None or rec[0]() is not mod or id(mod) not in self.transient_b:
            return False
        now = self._bind(mod, args, kwargs)
        if now is None:
            return False
        train = rec[1]
        for name, v in now.items():
            w = train.get(name, _ABSENT)
            d = self._describe(v)
            if d == ("v", None):
                continue
            if w is _ABSENT or d[0] != w[0] or d[0] == "o":
                return False
            if d[0] == "v" and d != w:
                return False
            if d[0] == "t" and (d[2] != w[2] or d[3] != w[3] or len(d[1]) != len(w[1])
                                or any(x > y for x, y in zip(d[1], w[1]))):
                return False
        return True

    # -- output shapes learned from traced calls ---------------------------------------------------
    def _family(self, mod: Any, args: Any, kwargs: Any) -> Optional[Tuple[Any, List[int]]]:
        """``(family key, input dims)``: calls of one module whose inputs differ in sizes only."""
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten((args, kwargs))
        key: List[Any] = [id(mod), str(spec), bool(mod.training)]
        dims: List[int] = []
        for leaf in leaves:
            if isinstance(leaf, self.torch.Tensor):
                key.append((str(leaf.dtype), leaf.dim(), self.on_gpu(leaf)))
                dims.extend(int(d) for d in leaf.shape)
            elif leaf is None or isinstance(leaf, _PLAIN):
                key.append(("v", leaf))
            else:
                return None
        return tuple(key), dims

    def observe(self, mod: Any, args: Any, kwargs: Any, out_skel: Any) -> None:
        """Keep a traced no-grad call's input dims and output skeleton (None: nothing); 8 per family."""
        fam = self._family(mod, args, kwargs)
        if fam is None or out_skel is None:
            return
        seen = self.observed.setdefault(fam[0], [])
        if len(seen) < 8 and all(dims != fam[1] for dims, _ in seen):
            seen.append((fam[1], out_skel))

    def _predict(self, fam: Tuple[Any, List[int]]) -> Optional[Any]:
        """The output skeleton for new input dims, when every output dim is one constant or one input dim
        in all observed calls and that rule gives one value; else None."""
        seen = self.observed.get(fam[0], [])
        if len(seen) < 2:
            return None
        spec, leaves = seen[-1][1]
        if any(str(s[1][0]) != str(spec) or len(s[1][1]) != len(leaves) for s in seen):
            return None
        made: List[Any] = []
        for i, leaf in enumerate(leaves):
            if leaf[0] != "t":
                if any(s[1][1][i] != leaf for s in seen):
                    return None
                made.append(leaf)
                continue
            if any(s[1][1][i][0] != "t" or s[1][1][i][2] != leaf[2] or len(s[1][1][i][1]) != len(leaf[1])
                   for s in seen):
                return None
            shape = []
            for j in range(len(leaf[1])):
                outs = [s[1][1][i][1][j] for s in seen]
                values = {outs[0]} if len(set(outs)) == 1 else set()
                for k in range(len(fam[1])):
                    if all(len(s[0]) == len(fam[1]) and s[0][k] == o for s, o in zip(seen, outs)):
                        values.add(fam[1][k])
                if len(values) != 1:
                    return None
                shape.append(values.pop())
            made.append(("t", tuple(shape)) + tuple(leaf[2:]))
        return spec, made

    def try_call(self, mod: Any, args: Any, kwargs: Any, rebuild: Callable[[Any], Any]) -> Tuple[bool, Any]:
        """``(True, output)`` for a dominated call of predicted output shapes, else ``(False, None)``."""
        fam = self._family(mod, args, kwargs)
        if fam is None or fam[0] not in self.observed or not self._dominated(mod, args, kwargs):
            return False, None
        skel = self._predict(fam)
        if skel is None:
            return False, None
        self.pending_b[id(mod)] = max(self.pending_b.get(id(mod), 0), int(self.alloc.allocated_b))
        self.skipped += 1
        return True, rebuild(skel)

    # -- at the end ------------------------------------------------------------------------------
    def settle(self, note: Callable[[str], None]) -> None:
        """Raise the replayed peaks to the skipped calls' bound where higher (per module: bytes allocated at
        its skipped calls plus its training transient; reserved: the excess rounded up to ``BLOCK_B``)."""
        if not self.skipped:
            return
        a = self.alloc
        self.bound_b = max(held + self.transient_b.get(key, 0) for key, held in self.pending_b.items())
        over = self.bound_b - int(a.peak_allocated_b)
        head = (f"{self.skipped} no-grad forward(s) with inputs no larger than the training call's answered "
                "with output shapes learned from traced calls (generation loop), each bounded by the "
                "training forward's memory")
        if over <= 0:
            note(head + ": within the replayed peak")
            return
        a.peak_allocated_b = self.bound_b
        a.peak_reserved_b += -(-over // BLOCK_B) * BLOCK_B
        note(head + f": the peak raised by {over / 2**20:.0f} MiB")
