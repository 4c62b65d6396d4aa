"""TileLang's language on a CPU: the part of ``tilelang.language`` (imported as ``T``) that the course's
attention programs use, run in Python, one program (CUDA block) after another.

The course writes a TileLang program as a function of the language module::

    def program(T, dtype, D, causal, tiles):
        B, S = T.dynamic("B, S")

        @T.prim_func
        def kernel(X: T.Tensor([B, S, D], dtype), Y: T.Tensor([B, S, D], dtype)):
            with T.Kernel(T.ceildiv(S, 64), B, threads=128) as (bx, b):
                x = T.alloc_shared([64, D], dtype)
                T.copy(X[b, bx * 64:bx * 64 + 64, :], x)
                T.copy(x, Y[b, bx * 64:bx * 64 + 64, :])

        return kernel

Called with ``tilelang.language`` it gives TileLang's compiler a TIR PrimFunc (TMA, WGMMA, warp
specialisation: ``facourse.tilelang_kernels``); called with this module it gives a :class:`Program`
that runs on CPU torch tensors, so that the program's arithmetic, its masks and its loop bounds can
be checked on a machine without a GPU (and without tilelang). Each operation means here what it
means in TileLang:

* ``T.dynamic``: symbolic sizes, bound from the tensors' shapes at the call (a mismatch is an error);
* ``T.Kernel(gx, gy, gz)``: the body runs once per block index, x fastest; ``threads`` is ignored;
* ``T.alloc_shared`` / ``alloc_fragment`` / ``alloc_local``: buffers filled with NaN, as a GPU leaves
  them undefined: a value read before it was written shows up as NaN in the output;
* ``T.copy``: global -> on chip copies the part of the box inside the tensor and zero-fills the rest
  (what TMA does at a ragged edge); on chip -> global stores only the part inside the tensor; on chip
  -> on chip converts to the destination's dtype (float32 scores to float16 probabilities);
* ``T.gemm(A, B, C)``: C = A B (or += without ``clear_accum``), in float32 from the operands' stored
  values (a tensor core's products of fp16 inputs are exact in fp32);
* ``T.reduce_max`` / ``reduce_sum``: along ``dim``, into ``dst`` (kept and combined when ``clear=False``);
* ``T.Parallel``: every index in order, one element at a time (the body is per element, as in TIR);
  ``T.Pipelined`` and ``T.serial``: a plain loop (pipelining changes when loads happen, not results);
* element access to a global tensor out of its bounds raises (on a GPU: a fault, or silent corruption).

Scalars are NumPy's: a float32 buffer's element is a ``numpy.float32`` and arithmetic on it stays in
float32, as on the GPU. bfloat16 has no NumPy type: run a program here in float16 or float32.
What this cannot show: speed, layouts, shared-memory size, registers, and whether TileLang's compiler
accepts the program (``facourse.tilelang_kernels.hopper_source`` lowers it for sm_90a where tilelang
is installed).
"""
from __future__ import annotations

import builtins
import inspect
import itertools
import operator

import numpy as np
import torch


class EmulationError(RuntimeError):
    """The program did something the CPU stand-in (or TileLang) does not allow; the message says what."""


_NP = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64,
       "bool": np.bool_}
_TORCH = {torch.float16: "float16", torch.float32: "float32", torch.float64: "float64", torch.int32: "int32",
          torch.int64: "int64", torch.bool: "bool"}


class _DType(str):
    """A dtype name that is also a cast, like ``T.float32(x)``."""

    def __call__(self, x):
        return _np_dtype(self).type(x)


float16, bfloat16, float32, float64 = _DType("float16"), _DType("bfloat16"), _DType("float32"), _DType("float64")
int32, int64, boolean = _DType("int32"), _DType("int64"), _DType("bool")


def _np_dtype(dtype) -> np.dtype:
    name = str(dtype)
    if name == "bfloat16":
        raise EmulationError("the CPU stand-in of TileLang has no bfloat16 (NumPy has none): run the program "
                             "here in float16 or float32; on a GPU TileLang compiles it for bfloat16 as well")
    if name not in _NP:
        raise EmulationError(f"the CPU stand-in of TileLang has no dtype {name!r}: it has {', '.join(_NP)}")
    return np.dtype(_NP[name])


# ----------------------------------------------------------------------------- symbolic sizes
def _val(x):
    return x.value if isinstance(x, Sym) else x


class Sym:
    """A symbolic size (``T.dynamic``): bound to the matching tensor dimension when the program runs,
    and then an integer in every expression the program body computes with it."""

    def __init__(self, name: str):
        self.name, self._value = name, None

    @property
    def value(self) -> int:
        if self._value is None:
            raise EmulationError(f"the size {self.name} is not bound: name it in a tensor's shape of the "
                                 "prim_func's signature")
        return self._value

    def __index__(self):
        return self.value

    __int__ = __index__

    def __float__(self):
        return float(self.value)

    def __bool__(self):
        return bool(self.value)

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"Sym({self.name}={self._value})"

    def __neg__(self):
        return -self.value


def _binary(op):
    return (lambda self, other: op(self.value, _val(other)),
            lambda self, other: op(_val(other), self.value))


for _name in ("add", "sub", "mul", "floordiv", "truediv", "mod", "lt", "le", "gt", "ge", "eq", "ne", "and_",
              "or_", "lshift", "rshift"):
    _fwd, _rev = _binary(getattr(operator, _name))
    _dunder = _name.rstrip("_")
    setattr(Sym, f"__{_dunder}__", _fwd)
    if _name not in ("lt", "le", "gt", "ge", "eq", "ne"):
        setattr(Sym, f"__r{_dunder}__", _rev)


def dynamic(names: str, dtype: str = "int32"):
    """``T.dynamic("B, S")``: one :class:`Sym` per name (a tuple when there are several)."""
    syms = tuple(Sym(n.strip()) for n in names.split(",") if n.strip())
    return syms[0] if len(syms) == 1 else syms


symbolic = dynamic


# ----------------------------------------------------------------------------- buffers
class Tensor:
    """``T.Tensor(shape, dtype)`` in a prim_func's signature: the shape (ints and symbolic sizes) and dtype."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = list(shape), str(dtype)


Buffer = Tensor


class _Buf:
    """A buffer the program computes with: on chip (shared, fragment, local) or global (a tensor argument)."""

    def __init__(self, arr: np.ndarray, name: str, scope: str):
        self.arr, self.name, self.scope = arr, name, scope

    @property
    def shape(self):
        return self.arr.shape

    @property
    def dtype(self):
        return str(self.arr.dtype)

    def __getitem__(self, idx):
        return self.arr[idx]

    def __setitem__(self, idx, value):
        self.arr[idx] = value

    def __repr__(self):
        return f"<{self.scope} buffer {self.name} {list(self.arr.shape)} {self.arr.dtype}>"


class _Global(_Buf):
    """A tensor argument. A slice is a box (:class:`_Region`) for ``T.copy``; an element access must be
    in bounds."""

    def _index(self, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != self.arr.ndim:
            raise EmulationError(f"{self.name}{list(self.arr.shape)} indexed with {len(idx)} indices")
        return idx

    def __getitem__(self, idx):
        idx = self._index(idx)
        if any(isinstance(i, slice) for i in idx):
            return _Region(self, idx)
        self._bounds(idx, "read")
        return self.arr[tuple(_val(i) for i in idx)]

    def __setitem__(self, idx, value):
        idx = self._index(idx)
        if any(isinstance(i, slice) for i in idx):
            raise EmulationError(f"assigning to a slice of {self.name}: copy a box with T.copy(src, {self.name}[...])")
        self._bounds(idx, "write")
        self.arr[tuple(_val(i) for i in idx)] = value

    def _bounds(self, idx, what):
        for d, (i, n) in enumerate(zip(idx, self.arr.shape)):
            i = int(_val(i))
            if not 0 <= i < n:
                where = ", ".join(str(int(_val(x))) for x in idx)
                raise EmulationError(
                    f"{what} of {self.name}[{where}] is out of bounds (dimension {d} has {n}): on a GPU this "
                    f"{'faults or reads garbage' if what == 'read' else 'corrupts memory or faults'}; guard "
                    "the access (an `if` on the index) or let T.copy clip the box")


class _Region:
    """A box of a global tensor: ints pick one index of a dimension, slices a range (which may run past
    the tensor's end: T.copy zero-fills or clips that part)."""

    def __init__(self, glob: _Global, idx):
        self.glob, self.starts, self.stops, self.keep = glob, [], [], []
        for d, (i, n) in enumerate(zip(idx, glob.arr.shape)):
            if isinstance(i, slice):
                if i.step not in (None, 1):
                    raise EmulationError(f"a box of {glob.name} with a step: T.copy takes contiguous ranges")
                a = 0 if i.start is None else int(_val(i.start))
                b = n if i.stop is None else int(_val(i.stop))
                self.starts.append(a), self.stops.append(b), self.keep.append(True)
            else:
                a = int(_val(i))
                if not 0 <= a < n:
                    raise EmulationError(f"a box of {glob.name} at index {a} of dimension {d} (size {n})")
                self.starts.append(a), self.stops.append(a + 1), self.keep.append(False)

    @property
    def shape(self):
        return tuple(b - a for a, b, k in zip(self.starts, self.stops, self.keep) if k)

    def clipped(self):
        """(the in-bounds part of the tensor, the matching slices of a box-shaped buffer)."""
        src, dst = [], []
        for a, b, k, n in zip(self.starts, self.stops, self.keep, self.glob.arr.shape):
            lo, hi = builtins.max(a, 0), builtins.min(b, n)
            hi = builtins.max(hi, lo)
            src.append(slice(lo, hi) if k else a)
            if k:
                dst.append(slice(lo - a, hi - a))
        return self.glob.arr[tuple(src)], tuple(dst)


def _alloc(shape, dtype, scope):
    shape = tuple(int(_val(s)) for s in (shape if isinstance(shape, (list, tuple)) else [shape]))
    dt = _np_dtype(dtype)
    fill = np.nan if dt.kind == "f" else 0
    return _Buf(np.full(shape, fill, dtype=dt), f"{scope}{list(shape)}", scope)


def alloc_shared(shape, dtype, scope="shared.dyn"):
    return _alloc(shape, dtype, "shared")


def alloc_fragment(shape, dtype, scope="local.fragment"):
    return _alloc(shape, dtype, "fragment")


def alloc_local(shape, dtype, scope="local"):
    return _alloc(shape, dtype, "local")


def _on_chip(x, what):
    if not isinstance(x, _Buf) or isinstance(x, _Global):
        raise EmulationError(f"{what} takes on-chip buffers (T.alloc_shared, T.alloc_fragment), got {x!r}")
    return x


def fill(buf, value):
    if isinstance(buf, _Region):
        raise EmulationError("T.fill of a global box: fill an on-chip buffer and T.copy it out")
    buf.arr.fill(value)


def clear(buf):
    fill(buf, 0)


def copy(src, dst, **_):
    """A box of a global tensor to an on-chip buffer and back, or one on-chip buffer to another."""
    if isinstance(src, _Global):
        src = src[tuple(slice(None) for _ in src.shape)]
    if isinstance(dst, _Global):
        dst = dst[tuple(slice(None) for _ in dst.shape)]
    if isinstance(src, _Region) and isinstance(dst, _Region):
        raise EmulationError("T.copy from global memory to global memory: stage the tile on chip")
    box = src if isinstance(src, _Region) else dst if isinstance(dst, _Region) else None
    buf = dst if box is src else src
    if box is not None and tuple(box.shape) != tuple(buf.shape):
        raise EmulationError(f"T.copy: the box of {box.glob.name} has shape {list(box.shape)}, the buffer "
                             f"{list(buf.shape)}: they must match")
    if box is None:
        if src.shape != dst.shape:
            raise EmulationError(f"T.copy: {list(src.shape)} into {list(dst.shape)}: the shapes must match")
        dst.arr[...] = src.arr
    elif box is src:                          # load: zero past the tensor's end (TMA's fill)
        part, where = box.clipped()
        tile = np.zeros(buf.shape, dtype=buf.arr.dtype)
        tile[where] = part
        buf.arr[...] = tile
    else:                                     # store: only the part inside the tensor
        part, where = box.clipped()
        part[...] = buf.arr[where]


def gemm(A, B, C, transpose_A=False, transpose_B=False, policy=None, clear_accum=False, **_):
    """C = A B (+ C unless clear_accum), in float32 from the operands' stored values."""
    for x, n in ((A, "A"), (B, "B"), (C, "C")):
        _on_chip(x, f"T.gemm's {n}")
    a = A.arr.astype(np.float32)
    b = B.arr.astype(np.float32)
    a = a.T if transpose_A else a
    b = b.T if transpose_B else b
    if a.shape[1] != b.shape[0] or (a.shape[0], b.shape[1]) != C.shape:
        raise EmulationError(f"T.gemm: A {list(a.shape)} times B {list(b.shape)} (after transposes) into C "
                             f"{list(C.shape)}: the shapes do not chain")
    prod = a @ b
    C.arr[...] = prod if clear_accum else C.arr + prod


def _reduce(src, dst, dim, clear, fn, combine, what):
    _on_chip(src, what), _on_chip(dst, what)
    r = fn(src.arr.astype(np.float32), axis=dim)
    if r.shape != dst.shape:
        raise EmulationError(f"{what}: {list(src.shape)} reduced along dim {dim} is {list(r.shape)}, "
                             f"but dst is {list(dst.shape)}")
    dst.arr[...] = r if clear else combine(dst.arr, r)


def reduce_max(src, dst, dim=-1, clear=True):
    _reduce(src, dst, dim, clear, np.max, np.maximum, "T.reduce_max")


def reduce_sum(src, dst, dim=-1, clear=True):
    _reduce(src, dst, dim, clear, np.sum, np.add, "T.reduce_sum")


def reduce_min(src, dst, dim=-1, clear=True):
    _reduce(src, dst, dim, clear, np.min, np.minimum, "T.reduce_min")


# ----------------------------------------------------------------------------- loops and scalars
def Parallel(*extents, **_):
    ranges = [range(int(_val(e))) for e in extents]
    return iter(ranges[0]) if len(ranges) == 1 else itertools.product(*ranges)


def Pipelined(start, stop=None, num_stages=0, **_):
    return range(int(_val(start))) if stop is None else range(int(_val(start)), int(_val(stop)))


def serial(start, stop=None, **_):
    return Pipelined(start, stop)


def ceildiv(a, b):
    return -(-_val(a) // _val(b))


def floordiv(a, b):
    return _val(a) // _val(b)


def truncdiv(a, b):
    a, b = _val(a), _val(b)
    return int(a / b)


def max(a, b):  # noqa: A001  (T.max)
    a, b = _val(a), _val(b)
    return a if a >= b else b


def min(a, b):  # noqa: A001  (T.min)
    a, b = _val(a), _val(b)
    return a if a <= b else b


def if_then_else(cond, a, b):
    return a if cond else b


def infinity(dtype):
    return _np_dtype(dtype).type(np.inf)


def cast(x, dtype):
    return _np_dtype(dtype).type(x)


def _math(fn):
    return lambda x: fn(x if isinstance(x, np.generic) else np.float32(x))


exp2, exp, log, log2, sqrt, rsqrt = (_math(np.exp2), _math(np.exp), _math(np.log), _math(np.log2),
                                     _math(np.sqrt), _math(lambda x: 1 / np.sqrt(x)))
abs = _math(np.abs)  # noqa: A001  (T.abs)


class GemmWarpPolicy:
    Square, FullRow, FullCol = "Square", "FullRow", "FullCol"


def annotate_layout(*_, **__):
    """Layouts place data for the hardware; values do not depend on them."""


def use_swizzle(*_, **__):
    """Block rasterisation: the order blocks run in, not what they compute."""


# ----------------------------------------------------------------------------- kernels and programs
class _Launch:
    def __init__(self):
        self.grid, self.index, self.entered = None, None, 0


_LAUNCHES: list[_Launch] = []


class Kernel:
    """``with T.Kernel(gx, gy, gz, threads=...) as (bx, by, bz)``: one block index per run of the body."""

    def __init__(self, *grid, threads=None, **_):
        self.grid = tuple(int(_val(g)) for g in grid)

    def __enter__(self):
        if not _LAUNCHES:
            raise EmulationError("T.Kernel outside a running prim_func")
        launch = _LAUNCHES[-1]
        launch.entered += 1
        if launch.entered > 1:
            raise EmulationError("one T.Kernel per prim_func: the CPU stand-in runs a single kernel")
        if launch.grid is None:
            launch.grid, launch.index = self.grid, tuple(0 for _ in self.grid)
        elif launch.grid != self.grid:
            raise EmulationError(f"the grid changed between blocks ({launch.grid} then {self.grid})")
        return launch.index[0] if len(launch.index) == 1 else launch.index

    def __exit__(self, *exc):
        return False


class Program:
    """A prim_func on the CPU stand-in: ``program(*tensors_and_scalars)`` runs every block in turn,
    writing its output tensors in place (CPU torch tensors, in the signature's order)."""

    def __init__(self, fn):
        self.fn = fn
        self.params = list(inspect.signature(fn).parameters.values())
        for p in self.params:
            if isinstance(p.annotation, str) and not isinstance(p.annotation, _DType):
                raise EmulationError(f"parameter {p.name}'s annotation is the string {p.annotation!r}: remove "
                                     "`from __future__ import annotations` where the prim_func is defined")

    def _bind(self, args):
        if len(args) != len(self.params):
            raise EmulationError(f"{self.fn.__name__} takes {len(self.params)} arguments "
                                 f"({', '.join(p.name for p in self.params)}), got {len(args)}")
        syms = [s for p in self.params if isinstance(p.annotation, Tensor) for s in p.annotation.shape
                if isinstance(s, Sym)]
        for s in syms:
            s._value = None
        bound = []
        for p, a in zip(self.params, args):
            spec = p.annotation
            if not isinstance(spec, Tensor):
                bound.append(a.item() if isinstance(a, torch.Tensor) else a)
                continue
            if not isinstance(a, torch.Tensor) or a.device.type != "cpu":
                raise EmulationError(f"{p.name}: the CPU stand-in takes CPU torch tensors, got {type(a).__name__}"
                                     + (f" on {a.device}" if isinstance(a, torch.Tensor) else ""))
            if _TORCH.get(a.dtype) != spec.dtype:
                raise EmulationError(f"{p.name} is declared {spec.dtype} but the tensor is {a.dtype}")
            if a.dim() != len(spec.shape):
                raise EmulationError(f"{p.name} is declared with {len(spec.shape)} dimensions, the tensor has {a.dim()}")
            for d, (s, n) in enumerate(zip(spec.shape, a.shape)):
                if isinstance(s, Sym):
                    if s._value is None:
                        s._value = int(n)
                    elif s._value != n:
                        raise EmulationError(f"{p.name}'s dimension {d} is {s.name}, bound to {s._value} by an "
                                             f"earlier argument, but it is {n}")
                elif int(s) != n:
                    raise EmulationError(f"{p.name}'s dimension {d} is declared {s}, the tensor has {n}")
            bound.append(_Global(a.detach().numpy(), p.name, "global"))
        return bound

    def __call__(self, *args):
        bound = self._bind(args)
        launch = _Launch()
        _LAUNCHES.append(launch)
        try:
            with np.errstate(all="ignore"):
                self.fn(*bound)                          # block (0, 0, 0): also learns the grid
                if launch.grid is None:
                    raise EmulationError(f"{self.fn.__name__} never entered a T.Kernel")
                for idx in itertools.product(*(range(g) for g in reversed(launch.grid))):
                    index = tuple(reversed(idx))
                    if any(index):
                        launch.index, launch.entered = index, 0
                        self.fn(*bound)
        finally:
            _LAUNCHES.pop()


def prim_func(fn=None, **_):
    """``@T.prim_func``: the function becomes a :class:`Program` that runs on the CPU stand-in."""
    return Program(fn) if fn is not None else Program


def __getattr__(name):
    raise AttributeError(
        f"the CPU stand-in of TileLang (facourse.tilelang_cpu) has no T.{name}: it has what the course's "
        "attention programs use (dynamic, prim_func, Tensor, Kernel, alloc_shared/fragment/local, fill, clear, "
        "copy, gemm, reduce_max/sum/min, Parallel, Pipelined, serial, ceildiv, floordiv, max, min, "
        "if_then_else, infinity, cast, exp2, exp, log, sqrt, abs, GemmWarpPolicy). Write the program with "
        "those, or run it with tilelang on a GPU machine")
