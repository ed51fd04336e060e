"""Convolution calls as the trace sees them, named by one string key (pure, no torch). ``aten.convolution``
and ``aten.convolution_backward`` may each take a cuDNN workspace from the caching allocator
(``aten/src/ATen/native/cudnn/Conv_v8.cpp``), measured per call (``benchmarks/device/conv_workspace.py``) and
looked up by this key (``workspace.py``):
``dir|dtype|input|weight|stride|padding|dilation|transposed|output_padding|groups|mask``, ``dir`` ``f`` or
``b``, shapes comma-joined ints, ``mask`` backward's output mask as three 0/1 digits (``-`` forward);
ResNet-50's stem, batch 32, fp32: ``f|float32|32,3,224,224|64,3,7,7|2,2|3,3|1,1|0|0,0|1|-``."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Sequence, SupportsInt, Tuple

from slurm_coloc.errors import EstimateError

DTYPES = ("float32", "float16", "bfloat16")


def _ints(v: Iterable[SupportsInt]) -> Tuple[int, ...]:
    return tuple(int(x) for x in v)


@dataclass(frozen=True)
class ConvCall:
    """One convolution call (shapes in elements, NC... layout as PyTorch passes them): ``dtype`` the input's;
    ``input`` ``(N, C_in, *spatial)``; ``weight`` ``(C_out, C_in/groups, *kernel)`` (transposed: ``(C_in,
    C_out/groups, ...)``); stride, padding, dilation, output_padding per spatial dim; ``groups == C_in`` for
    depthwise; ``mask`` backward's ``(grad_input, grad_weight, grad_bias)``, ``()`` forward."""

    backward: bool
    dtype: str
    input: Tuple[int, ...]
    weight: Tuple[int, ...]
    stride: Tuple[int, ...]
    padding: Tuple[int, ...]
    dilation: Tuple[int, ...]
    transposed: bool
    output_padding: Tuple[int, ...]
    groups: int
    mask: Tuple[bool, ...] = ()

    @property
    def key(self) -> str:
        j = lambda t: ",".join(str(int(x)) for x in t)
        mask = "".join("1" if m else "0" for m in self.mask) if self.backward else "-"
        return "|".join(["b" if self.backward else "f", self.dtype, j(self.input), j(self.weight),
                         j(self.stride), j(self.padding), j(self.dilation), str(int(self.transposed)),
                         j(self.output_padding), str(int(self.groups)), mask])

    @property
    def geometry_key(self) -> str:
        """The key without the batch size: the same layer at any batch size."""
        return split_batch(self.key)[0]

    @property
    def output_shape(self) -> Tuple[int, ...]:
        """The forward output's shape ``(N, C_out, *spatial)`` (PyTorch's convolution arithmetic)."""
        spatial = []
        for i, size in enumerate(self.input[2:]):
            k, s, p, d = self.weight[2 + i], self.stride[i], self.padding[i], self.dilation[i]
            if self.transposed:
                o = (size - 1) * s - 2 * p + d * (k - 1) + self.output_padding[i] + 1
            else:
                o = (size + 2 * p - d * (k - 1) - 1) // s + 1
            spatial.append(max(1, o))
        cout = self.weight[1] * self.groups if self.transposed else self.weight[0]
        return (int(self.input[0]), int(cout), *spatial)

    @property
    def batch(self) -> int:
        return int(self.input[0]) if self.input else 1

    def with_batch(self, n: int) -> "ConvCall":
        return ConvCall(self.backward, self.dtype, (int(n), *self.input[1:]), self.weight, self.stride,
                        self.padding, self.dilation, self.transposed, self.output_padding, self.groups,
                        self.mask)

    def to_json(self) -> Dict[str, Any]:
        """A JSON-ready dict (the device script's input format)."""
        return {"key": self.key, "backward": self.backward, "dtype": self.dtype, "input": list(self.input),
                "weight": list(self.weight), "stride": list(self.stride), "padding": list(self.padding),
                "dilation": list(self.dilation), "transposed": self.transposed,
                "output_padding": list(self.output_padding), "groups": self.groups,
                "mask": [bool(m) for m in self.mask]}


def split_batch(key: str) -> Tuple[str, int]:
    """``(geometry key, batch)`` of a key by string surgery, without parsing the rest (fast)."""
    d, dtype, inp, rest = key.split("|", 3)
    n, tail = inp.split(",", 1) if "," in inp else (inp, "")
    return f"{d}|{dtype}|{tail}|{rest}", int(n)


def parse_key(key: str) -> ConvCall:
    """The :class:`ConvCall` a key names; EstimateError when it is not of the module docstring's form."""
    parts = key.split("|")
    try:
        if len(parts) != 11 or parts[0] not in ("f", "b") or parts[1] not in DTYPES:
            raise ValueError("shape of key")
        ints = lambda s: tuple(int(x) for x in s.split(",")) if s else ()
        backward = parts[0] == "b"
        mask = tuple(c == "1" for c in parts[10]) if backward else ()
        if backward and len(mask) != 3:
            raise ValueError("mask")
        return ConvCall(backward, parts[1], ints(parts[2]), ints(parts[3]), ints(parts[4]), ints(parts[5]),
                        ints(parts[6]), parts[7] == "1", ints(parts[8]), int(parts[9]), mask)
    except ValueError as exc:
        raise EstimateError(f"convolution key {key!r} is malformed ({exc})") from exc


def from_aten(backward: bool, args: Sequence[Any]) -> ConvCall:
    """The call of a dispatched ``aten.convolution`` (``args``: input, weight, bias, stride, padding,
    dilation, transposed, output_padding, groups) or ``aten.convolution_backward`` (grad_output, input,
    weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask); tensors:
    shape, dtype only."""
    if backward:
        _go, x, w, _bs, stride, padding, dilation, transposed, out_pad, groups, mask = args[:11]
        mask_t: Tuple[bool, ...] = tuple(bool(m) for m in mask)
    else:
        x, w, _b, stride, padding, dilation, transposed, out_pad, groups = args[:9]
        mask_t = ()
    dtype = str(x.dtype).replace("torch.", "")
    return ConvCall(bool(backward), dtype, _ints(x.shape), _ints(w.shape), _ints(stride), _ints(padding),
                    _ints(dilation), bool(transposed), _ints(out_pad), int(groups), mask_t)


def workspace_parts(call: ConvCall) -> Tuple[ConvCall, ...]:
    """The cuDNN calls, in order, taking a workspace each for ``call``: a backward computing both gradients
    runs cuDNN twice, grad input then grad weight (``cudnn/ConvShared.cpp``), each with its own workspace, two
    blocks the allocator may not fit into one segment (VGG-16 at batch 128 on the H100: two 3.1 GiB segments,
    ``benchmarks/device/mem_snapshot.py``): split into masks ``(1, 0, 0)`` and ``(0, 1, 0)``."""
    if call.backward and len(call.mask) == 3 and call.mask[0] and call.mask[1]:
        return (dataclasses.replace(call, mask=(True, False, False)),
                dataclasses.replace(call, mask=(False, True, False)))
    return (call,)
