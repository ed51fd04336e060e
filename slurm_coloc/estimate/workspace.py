"""cuDNN convolution workspace per call, from a table measured on the GPU.

At each convolution call the trace replays the transient workspace block cuDNN takes from the caching
allocator; without it the replay missed up to 4 GiB on VGG-16 at batch 128 and 1.2-3.8x the reserved memory
of small CNNs (docs/estimator.md). Its size, what PyTorch's chosen algorithm needs, is measured on the H100
(``benchmarks/device/conv_workspace.py``) and shipped as ``weights/conv_workspace_h100.npz`` (``key, ws_b,
srcs``; keys from ``convcall.py``; ``srcs`` names the data sets a call came from, so evaluations can leave a
family out). Lookup (:meth:`WorkspaceModel.bytes_for`), in order:

1. the call measured: its figure;
2. the same layer (geometry key) at other batch sizes: linear in the batch between the nearest measured;
   above the largest ``ws(N_max) * N / N_max``; below the smallest ``ws(N_min)``;
3. else the largest of the ``K_NEIGHBOURS`` nearest calls of the same kind (direction, dtype, grad-input,
   depthwise, transposed, spatial rank) in log-shape space, each scaled by the ratio of tensor sizes: a
   conservative guess.

cuDNN picks per architecture, so for other GPUs (A100) the H100 table is a proxy. Pure numpy, no torch.
"""
from __future__ import annotations

import bisect
import csv
import gzip
import io
import math
import os
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple, Union

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate.convcall import ConvCall, parse_key, split_batch

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike

TABLE_FILE = os.path.join(os.path.dirname(__file__), "weights", "conv_workspace_h100.npz")
TABLE_ARCH = "sm90"  # the table was measured on an H100 (Hopper); H200 shares its cuDNN heuristics
K_NEIGHBOURS = 3
MAX_SCALE = 4.0  # a neighbour's figure is scaled by at most this factor (either way)


def size_elems(c: ConvCall) -> int:
    """Input plus output elements of a call (the scale a neighbour's workspace is carried by)."""
    return int(math.prod(c.input)) + int(math.prod(c.output_shape))


def kind_of(c: ConvCall) -> Tuple:
    """The class a nearest-neighbour lookup stays within."""
    depthwise = c.groups > 1 and c.groups == (c.input[1] if len(c.input) > 1 else 0)
    grad_in = bool(c.mask[0]) if c.backward else False
    return (c.backward, c.dtype, grad_in, depthwise, c.transposed, len(c.input))


def features(c: ConvCall) -> List[float]:
    """8 log-shape features of a call for the nearest-neighbour fallback: log2 of batch, input and output
    channels; half log2 of the spatial size; twice the mean kernel size; twice the largest stride; log2
    groups; the largest dilation."""
    spatial = c.input[2:] or (1,)
    kern = c.weight[2:] or (1,)
    cout = c.weight[1] * c.groups if c.transposed else c.weight[0]
    return [math.log2(max(1, c.input[0])), math.log2(max(1, c.input[1])), math.log2(max(1, cout)),
            math.log2(max(1, math.prod(spatial))) / 2.0, 2.0 * sum(kern) / len(kern),
            2.0 * max(c.stride or (1,)), math.log2(max(1, c.groups)), max(c.dilation or (1,))]


def kind_code(c: ConvCall) -> str:
    """:func:`kind_of` as a short string (the table file's ``kind`` column)."""
    return "|".join(str(int(v)) if isinstance(v, bool) else str(v) for v in kind_of(c))


class WorkspaceModel:
    """Measured workspaces (bytes per key) and the lookup of the module docstring. ``feats``, ``kinds``,
    ``sizes`` come precomputed in the shipped table; None: computed from the keys (EstimateError: a bad
    key)."""

    def __init__(self, keys: "Union[Sequence[Union[str, bytes]], np.ndarray]", ws_b: "ArrayLike",
                 feats: "Optional[ArrayLike]" = None, kinds: "Optional[ArrayLike]" = None,
                 sizes: "Optional[ArrayLike]" = None) -> None:
        import numpy as np

        keys_s = np.asarray([k.encode() if isinstance(k, str) else bytes(k) for k in keys], dtype="S") \
            if not (isinstance(keys, np.ndarray) and keys.dtype.kind == "S") else keys
        ws = np.asarray(ws_b, dtype=np.int64)
        if feats is None:
            calls = [parse_key(k.decode()) for k in keys_s.tolist()]
            feats = [features(c) for c in calls]
            kinds = [kind_code(c) for c in calls]
            sizes = [size_elems(c) for c in calls]
        order = np.argsort(keys_s, kind="stable")
        self._keys = keys_s[order]  # sorted: exact lookups by binary search, no dict to build
        self._ws = ws[order]
        self._feats = np.asarray(feats, dtype=np.float64).reshape(len(ws), -1)[order]
        self._kinds = np.asarray(kinds, dtype="S")[order]
        self._sizes = np.asarray(sizes, dtype=np.float64)[order]
        self._exact_map: Optional[Dict[str, int]] = None
        self._by_geometry: Optional[Dict[str, List[Tuple[int, int]]]] = None
        self._nn: Dict[str, Tuple[Any, Any, Any]] = {}
        self._memo: Dict[str, int] = {}

    @property
    def exact(self) -> Dict[str, int]:
        """Key -> measured workspace bytes (the largest where a key repeats; built on first use)."""
        if self._exact_map is None:
            out: Dict[str, int] = {}
            for k, w in zip(self._keys.tolist(), self._ws.tolist()):
                ks = k.decode()
                out[ks] = max(int(w), out.get(ks, 0))
            self._exact_map = out
        return self._exact_map

    def _exact(self, key: str) -> Optional[int]:
        import numpy as np

        kb = key.encode()
        i = int(np.searchsorted(self._keys, kb, side="right")) - 1
        if i < 0 or self._keys[i] != kb:
            return None
        j = int(np.searchsorted(self._keys, kb, side="left"))
        return int(self._ws[j:i + 1].max())

    @classmethod
    def from_rows(cls, rows: Iterable[Tuple[str, int]]) -> "WorkspaceModel":
        """Build from ``(key, workspace bytes)`` pairs (features computed; EstimateError: a malformed key)."""
        pairs = list(rows)
        return cls([k for k, _ in pairs], [w for _, w in pairs])

    @property
    def by_geometry(self) -> Dict[str, List[Tuple[int, int]]]:
        """Geometry key -> sorted ``[(batch, bytes)]`` (built on first use)."""
        if self._by_geometry is None:
            geo: Dict[str, List[Tuple[int, int]]] = {}
            for k, w in self.exact.items():  # built on the first call no table holds
                g, n = split_batch(k)
                geo.setdefault(g, []).append((n, w))
            for pts in geo.values():
                pts.sort()
            self._by_geometry = geo
        return self._by_geometry

    def bytes_for(self, call: ConvCall) -> int:
        """Workspace bytes (rounded up) ``call`` takes on the measured GPU (module docstring's lookup,
        memoised per key); 0 when nothing comparable is known."""
        key = call.key
        hit = self._memo.get(key)
        if hit is None:
            hit = self._lookup(call, key)
            self._memo[key] = hit
        return hit

    def _lookup(self, call: ConvCall, key: str) -> int:
        hit = self._exact(key)
        if hit is not None:
            return hit
        pts = self.by_geometry.get(call.geometry_key)
        if pts:
            n = call.batch
            ns = [p[0] for p in pts]
            i = bisect.bisect_left(ns, n)
            if i >= len(pts):
                return int(math.ceil(pts[-1][1] * n / max(1, pts[-1][0])))
            if i == 0:
                return int(pts[0][1])
            (n0, w0), (n1, w1) = pts[i - 1], pts[i]
            return int(math.ceil(w0 + (w1 - w0) * (n - n0) / max(1, n1 - n0)))
        return self._neighbours(call)

    def _neighbours(self, call: ConvCall) -> int:
        import numpy as np

        kind = kind_code(call)
        if kind not in self._nn:
            sel = self._kinds == kind.encode()
            self._nn[kind] = (self._feats[sel], self._ws[sel], self._sizes[sel])
        x, ws, size = self._nn[kind]
        if len(ws) == 0:
            return 0
        d = ((x - np.array(features(call))) ** 2).sum(axis=1)
        idx = np.argsort(d)[:K_NEIGHBOURS]
        scale = np.clip(size_elems(call) / size[idx], 1.0 / MAX_SCALE, MAX_SCALE)
        return int(math.ceil(float((ws[idx] * scale).max())))


_CACHE: Dict[FrozenSet[str], Optional[WorkspaceModel]] = {}


def read_table(path: Optional[str] = None) -> List[Tuple[str, int, FrozenSet[str]]]:
    """``(key, workspace bytes, set of sources)`` rows of the shipped ``.npz`` (``path`` None) or a ``key,
    ws_b, srcs`` CSV (``.csv``, ``.csv.gz``; rows without ``ws_b`` skipped).

    Raises:
        EstimateError: the file is unreadable or lacks the columns.
    """
    path = path or TABLE_FILE
    try:
        if path.endswith(".npz"):
            arrs = _read_npz(path)
            return [(k.decode(), int(w), frozenset(x for x in s.split(";") if x))
                    for k, w, s in zip(arrs["keys"].tolist(), arrs["ws_b"], arrs["srcs"])]
        with open(path, "rb") as fh:
            raw = fh.read()
        text = gzip.decompress(raw).decode() if path.endswith(".gz") else raw.decode()
        return [(r["key"], int(r["ws_b"]), frozenset(s for s in r.get("srcs", "").split(";") if s))
                for r in csv.DictReader(io.StringIO(text)) if r.get("ws_b", "") != ""]
    except (OSError, KeyError, ValueError, EOFError, gzip.BadGzipFile) as exc:
        raise EstimateError(f"convolution workspace table {path}: unusable ({exc})") from exc


NPZ_ARRAYS = ("keys", "ws_b", "srcs", "kinds", "feats", "sizes")


def write_npz(path: str, rows: Sequence[Tuple[str, int, str]]) -> None:
    """Write the shipped table: ``(key, ws_b, srcs joined by ';')`` rows plus each call's lookup features (so
    loading parses no key). EstimateError: a malformed key."""
    import numpy as np

    calls = [parse_key(k) for k, _, _ in rows]
    np.savez_compressed(
        path, keys=np.array([k for k, _, _ in rows], dtype="S"),
        ws_b=np.array([w for _, w, _ in rows], dtype=np.int64),
        srcs=np.array([s for _, _, s in rows], dtype="S"),
        kinds=np.array([kind_code(c) for c in calls], dtype="S"),
        feats=np.array([features(c) for c in calls], dtype=np.float32),
        sizes=np.array([size_elems(c) for c in calls], dtype=np.float64))


def _read_npz(path: str, decode_srcs: bool = True) -> Dict[str, Any]:
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        missing = [a for a in NPZ_ARRAYS if a not in z.files]
        if missing:
            raise KeyError(f"arrays {missing} missing")
        out = {a: z[a] for a in NPZ_ARRAYS if a != "srcs" or decode_srcs}
    if decode_srcs:
        out["srcs"] = out["srcs"].astype("U").tolist()
    return out


def load(exclude_srcs: Iterable[str] = ()) -> Optional[WorkspaceModel]:
    """The shipped table's model (cached per exclusion), or None when none is shipped; ``exclude_srcs`` leaves
    out calls measured *only* for these sources (``{"hopper:vgg"}``), to score unseen families.

    Raises:
        EstimateError: the shipped table is unreadable."""
    ex = frozenset(exclude_srcs)
    if ex not in _CACHE:
        if not os.path.isfile(TABLE_FILE):
            _CACHE[ex] = None
        elif not TABLE_FILE.endswith(".npz"):
            rows = read_table(TABLE_FILE)
            _CACHE[ex] = WorkspaceModel.from_rows((k, w) for k, w, s in rows if not (s and s <= ex))
        else:
            try:
                a = _read_npz(TABLE_FILE, decode_srcs=bool(ex))
            except (OSError, KeyError, ValueError, EOFError) as exc:
                raise EstimateError(f"convolution workspace table {TABLE_FILE}: unusable ({exc})") from exc
            if not ex:
                _CACHE[ex] = WorkspaceModel(a["keys"], a["ws_b"], a["feats"], a["kinds"], a["sizes"])
            else:
                keep = [i for i, s in enumerate(a["srcs"]) if not (s and set(s.split(";")) <= ex)]
                _CACHE[ex] = WorkspaceModel(a["keys"][keep], a["ws_b"][keep], a["feats"][keep],
                                            a["kinds"][keep], a["sizes"][keep])
    return _CACHE[ex]
