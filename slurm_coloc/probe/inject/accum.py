"""Gradient accumulation in a probe: repeated micro-steps of one optimizer cycle skipped after the first two.

A loop that accumulates gradients runs ``k`` forward+backward micro-steps per ``optimizer.step()``
(nanoGPT's ``train_gpt2.py``: 40 of 12 x 1024 tokens). Each micro-step after the second holds the memory the
second held: ``.grad`` already exists and a micro-step's activations are freed by its ``backward()``. So
within one cycle (between two optimizer steps of any optimizer):

* a micro-step runs from one ``backward()`` to the next: its top-level grad-enabled module calls (module,
  input structure, shapes, dtypes, ``training``, autocast);
* when the two micro-steps before it were each exactly one such call with the same key, and the new one's
  call has it too, the call returns a stand-in output (new fake GPU tensors as recorded, memory replayed) and
  its ``backward()`` does nothing;
* anything different runs for real; a second grad-enabled call inside a skipped micro-step stops skipping for
  the rest of the probe (noted): the probe never guesses a micro-step it has not seen twice.

FLOPs: each skipped micro-step adds those counted for its cycle's second micro-step, so a step's count is
that of all ``k``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

SKIP_AFTER = 2  # identical micro-steps run in a cycle before repeats are skipped


class MicroSteps:
    """Skips repeated grad-enabled micro-steps of one optimizer cycle (module docstring).

    ``evals`` is the probe's ``evalpass.EvalPasses``; ``flops_total`` returns the FLOP counter's running total
    or None. ``extra_flops``: FLOPs credited for skipped micro-steps (added to every later reading);
    ``broken``: a skipped micro-step turned out irregular, nothing is skipped after it.
    """

    def __init__(self, torch: Any, evals: Any, flops_total: Callable[[], Optional[int]]) -> None:
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
        """A top-level grad-enabled module call: run ``orig``, or answer a repeated micro-step's call.

        A call whose key matched the only call of the last ``SKIP_AFTER`` micro-steps gets its rebuilt output
        (grad-requiring, ``EvalPasses.rebuild``) and its micro-step is skipped.
        """
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
        """The micro-step in progress ends."""
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
