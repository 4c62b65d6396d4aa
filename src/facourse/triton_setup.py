"""Triton on any machine: without a GPU, its interpreter runs kernels on the CPU (in NumPy).

Call :func:`interpret_without_gpu` before any ``@triton.jit`` kernel is defined (Triton decides
at decoration time whether a kernel is compiled or interpreted).
"""
from __future__ import annotations

import os

import torch

from .reference import AttentionInputError, validate_inputs

#: Head dimensions the course's Triton kernels support: tl.arange needs a power of 2 and tl.dot
#: at least 16; the course's contract is D = 64 or 128.
TRITON_HEAD_DIMS = (64, 128)


def interpreting() -> bool:
    """True when Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def validate_triton_inputs(q, k, v, scale=None, head_dims=TRITON_HEAD_DIMS) -> None:
    """The entry check of a Triton attention wrapper: :func:`facourse.validate_inputs` (the tensor
    contract, ``stride(-1) == 1``), the head dims the kernel supports, and no bf16 in the
    interpreter. Raises :class:`facourse.AttentionInputError`, one line naming the fix."""
    validate_inputs(q, k, v, scale)
    if q.dtype == torch.bfloat16 and interpreting():
        raise AttentionInputError(
            "bf16 inputs in Triton's CPU interpreter (TRITON_INTERPRET=1, used when there is no GPU) give "
            "wrong results: NumPy has no bfloat16, so its dot products come out garbled; pass float16 or "
            "float32 (q.float(), k.float(), v.float()), or run on a GPU")
    validate_inputs(q, k, v, scale, head_dims=head_dims)


def interpret_without_gpu() -> bool:
    """Switch Triton to its interpreter when no GPU is present; True when kernels will be interpreted."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    _index_scalars_by_element()
    _patch_language_once_per_launch()
    _lighter_frontend()
    _no_dead_overflow_checks()
    return True


def compile_for(fn, types: dict, const: dict, capability: int = 90, divisible: tuple = (), **options):
    """``fn`` (a ``@triton.jit`` or ``@gluon.jit`` kernel defined with the interpreter off) compiled by Triton for an
    NVIDIA GPU of compute ``capability``, no GPU needed: the arguments named in ``const`` are those constexprs (a
    constexpr parameter left out takes its default), the others typed by ``types`` (Triton's names: "*fp16", "fp32",
    "tensordesc<fp8e4nv[16, 128]>", Gluon's with the layout after a comma; default "i32"), every pointer 16-byte
    aligned, and the integers named in ``divisible`` multiples of 16 (what a launch with such values specialises,
    strides of [B, H, S, 128] tensors among them). ``options``: Triton's (num_warps, num_stages). Returns the
    CompiledKernel (its ``asm``: ttgir, ptx, cubin)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

    names = fn.arg_names
    # a constexpr left out takes its default, as at a launch (typed "i32" it would compile as a runtime branch)
    const = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **const}
    sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*") or n in divisible}
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else triton.compiler.ASTSource   # Gluon's or Triton's
    src = source(fn=fn, signature=sig, attrs=attrs, constexprs={(names.index(k),): v for k, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)


def _patch_language_once_per_launch() -> None:
    """Triton 3.6's interpreter swaps triton.language's functions for NumPy ones when a kernel is
    launched, and again at every call of a ``@triton.jit`` helper inside it (an online-softmax step,
    a mask function: once per tile per program), scanning the helper's module globals and every
    member of triton.language each time: a quarter of the CPU time of the course's block kernels.
    Within one launch, a helper whose triton.language modules (triton.language, triton.language.core)
    were already swapped in that launch would get the same functions again: its swap is skipped. The
    launch's own swap and its undoing, and each module's first swap, are Triton's."""
    import inspect

    import triton.language as tl
    import triton.runtime.interpreter as interp

    orig = interp._patch_lang
    if getattr(orig, "once_per_launch", False):
        return
    launch: list = []                 # inside a kernel launch: the modules swapped so far (None: none)
    langs_of: dict = {}                # fn -> ids of the triton.language modules its globals hold

    def langs(fn) -> frozenset:
        key = (fn, id(fn.__globals__))
        if key not in langs_of:
            langs_of[key] = frozenset(id(v) for v in fn.__globals__.values()
                                      if inspect.ismodule(v) and v in (tl, tl.core))
        return langs_of[key]

    def patch_lang(fn):
        mine = langs(fn)
        if launch and launch[-1] is not None and mine and mine <= launch[-1]:
            return interp._LangPatchScope()            # already swapped by this launch: nothing to undo
        scope = orig(fn)
        if launch:                      # the launch's own swap, or a helper's first of another module
            launch[-1] = (launch[-1] or set()) | mine
        return scope

    run = interp.GridExecutor.__call__

    def launch_kernel(self, *args, **kwargs):
        launch.append(None)
        try:
            return run(self, *args, **kwargs)
        finally:
            launch.pop()

    interp.GridExecutor.__call__ = launch_kernel
    patch_lang.once_per_launch = True
    interp._patch_lang = patch_lang


def _index_scalars_by_element() -> None:
    """Triton 3.6's interpreter keeps a scalar as a 1-element array, and NumPy >= 2.4 refuses
    ``int()`` of one, so a loop bound computed from ``tl.program_id`` crashes it. Read the element."""
    import triton.runtime.interpreter as interp

    orig = interp._patch_lang_tensor
    if getattr(orig, "fixed", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.fixed = True
    interp._patch_lang_tensor = patched


def _lighter_frontend() -> None:
    """Two costs of Triton 3.6's frontend that its interpreter pays on every operation of every
    program (a quarter of the CPU time of the course's interpreted kernels): ``tl.tuple`` works out its
    type when it is made (one for every tensor's shape, most never read), and ``_get_np_dtype`` builds a
    dict of NumPy dtypes at every call. Here a tuple's type is worked out when first read, from the same
    values, and the dtypes are looked up in one dict; a block type's shape, numel and name, and its tensors'
    shape as constexprs, are worked out once per element type and shape (each tensor gets a tuple of its
    own). Every result is Triton's."""
    import builtins
    import math

    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interp

    core = tl.core
    if getattr(core.tuple.__init__, "lazy_type", False):
        return

    class LazyType:                   # a non-data descriptor: an assigned type lives in the instance
        def __get__(self, obj, cls=None):
            if obj is None:
                return self
            obj.__dict__["type"] = t = core._type_for_tuple_values(obj.values)
            return t

    def tuple_init(self, args, type=None):
        self.values = [i for i in args]
        if isinstance(type, core.tuple_type):
            self.type = type
        elif type is not None:
            self.type = core.tuple_type(type)

    tuple_init.lazy_type = True
    core.tuple.type = LazyType()
    core.tuple.__init__ = tuple_init

    block_init = core.block_type.__init__
    blocks: dict = {}  # (element type, shape) -> what Triton works out: shape, numel, name; a tensor's numel and shape

    def type_key(t):                  # pointer types are unhashable (__eq__ without __hash__)
        if isinstance(t, core.pointer_type):
            return ("ptr", type_key(t.element_ty), t.address_space, t.const)
        return t

    def block_type_init(self, element_ty, shape):
        try:                          # ints and constexprs hash apart: two entries, each Triton's own result
            key = (type(element_ty), type_key(element_ty), builtins.tuple(shape))
            hit = blocks.get(key)
        except TypeError:             # something unhashable in the shape: Triton's own path, and its error
            key = hit = None
        if hit is None:
            block_init(self, element_ty, shape)
            hit = (self.shape, self.numel, self.name, core.constexpr(math.prod(self.shape)),
                   [core.constexpr(s) for s in self.shape])
            if key is not None:
                blocks[key] = hit
        else:
            self.element_ty = element_ty
            self.shape, self.numel, self.name = hit[:3]
        self._tensor_shape = hit[3:]

    core.block_type.__init__ = block_type_init

    def tensor_init(self, handle, type):
        self.handle = handle
        self.type = type
        if type.is_block():
            self.dtype = type.element_ty
            numel, dims = type.__dict__.get("_tensor_shape") or (core.constexpr(math.prod(type.shape)),
                                                                  [core.constexpr(s) for s in type.shape])
            self.numel, self.shape = numel, core.tuple(dims)     # a tuple of its own: Triton's type
        else:
            self.dtype = type.scalar
            self.numel, self.shape = core.constexpr(1), core.tuple([])

    core.tensor.__init__ = tensor_init

    orig = interp._get_np_dtype
    table: dict = {}

    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):
            return np.dtype(np.uint64)
        if tt_dtype not in table:
            table[tt_dtype] = orig(tt_dtype)
        return table[tt_dtype]

    interp._get_np_dtype = get_np_dtype


def _no_dead_overflow_checks() -> None:
    """Triton 3.6's interpreter sanitizes integer overflow (``sanitize_overflow``) on every 32-bit add, sub
    and mul: it redoes the operation in int64 and compares it with the bounds, then hands the result to
    ``device_assert``, which does nothing unless ``debug`` is set, and the interpreter's ``debug`` is never
    set. A quarter of the CPU time of step 09's paged decode went to checks that could not fire:
    without ``debug`` they are skipped, as in a compiled kernel; every value is Triton's."""
    import dataclasses

    import triton.runtime.interpreter as interp

    cls = interp.InterpreterBuilder
    if getattr(cls.__init__, "no_dead_checks", False):
        return
    orig = cls.__init__

    def init(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        if not self.options.debug:
            self.options = dataclasses.replace(self.options, sanitize_overflow=False)

    init.no_dead_checks = True
    cls.__init__ = init
    b = interp.interpreter_builder
    if not b.options.debug:
        b.options = dataclasses.replace(b.options, sanitize_overflow=False)
