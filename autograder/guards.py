"""Anti-cheat for the hidden test cells. Grading only: never shipped to students.

Hidden cells call these around the student's entry point:

    check_entry_point(forbid_framework_attention(tiled_attention), "medium", expect_lse=True)
    check_no_caching(forbid_framework_attention(tiled_attention), "medium", expect_lse=True)

* :func:`forbid_framework_attention` wraps an entry point so that, while it runs, calling
  PyTorch's own attention raises :class:`CheatDetected` (``scaled_dot_product_attention`` under
  any name, its fused kernels, ``nn.MultiheadAttention``) and, unless ``allow_softmax``, a
  softmax that spans all ``Skv`` keys at once (the full score matrix, which tiling exists to
  avoid). It hooks both PyTorch's function layer (clear names) and its dispatcher (every route to
  the same kernels: ``torch.ops.aten``, ``Tensor.softmax``, ``nn.Softmax``, ...). A call the
  student's code catches and hides is still reported when the entry point returns.
* :func:`check_no_caching` calls the entry point on two fresh draws of the same shape, on the
  same inputs twice and on the same tensors refilled in place with new values; each result must
  be right and earlier outputs must not change. A function that returns a cached or precomputed
  output fails with a message that says so.
* :func:`roofline_verdict` says whether a measured time is faster than the GPU can possibly run
  the work (above its peak tensor throughput): then the measurement is not trusted and the perf
  test scores 0 (:meth:`autograder.judge.Judge._perf` calls it).

Inputs are always drawn from fresh seeds the student never sees; mutating the inputs and leaving
part of the output unwritten are caught by ``facourse.check_entry_point`` itself.
"""
from __future__ import annotations

import contextlib
import functools
import re
import secrets
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from facourse import AttentionCheckError, check_attention, get_config, make_inputs
from facourse.check import is_collecting

#: A softmax over more keys than this, spanning all Skv of them, counts as "the full score matrix"
#: (a default key tile is 64 wide; below this size a tile and the whole row cannot be told apart).
MIN_KEYS = 64


class CheatDetected(AssertionError):
    """The entry point did something the exercise forbids. The message says what and why."""


# ----------------------------------------------------------------------------- framework attention
_F = torch.nn.functional
_SDPA_FUNCS = {_F.scaled_dot_product_attention: "torch.nn.functional.scaled_dot_product_attention",
               _F.multi_head_attention_forward: "torch.nn.functional.multi_head_attention_forward"}
_SOFTMAX_FUNCS = {torch.softmax: "torch.softmax", _F.softmax: "torch.nn.functional.softmax",
                  torch.Tensor.softmax: "Tensor.softmax", torch.special.softmax: "torch.special.softmax",
                  torch.log_softmax: "torch.log_softmax", _F.log_softmax: "torch.nn.functional.log_softmax",
                  torch.Tensor.log_softmax: "Tensor.log_softmax"}
# Dispatcher-level names (aten::...): every route to PyTorch's attention kernels ends in one of these
# (torch.nn.attention.varlen's custom op, torch_attn::_varlen_attn, calls FlashAttention-2 below the dispatcher).
_ATEN_ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention",
                   "_fused_sdp", "_native_multi_head_attention", "_transformer_encoder", "varlen_attn")
_ATEN_SOFTMAX = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::log_softmax",
                 "aten::_log_softmax", "aten::special_softmax")

# Matrix products: forbidden where the step grades kernels that compute them (step 08's backward).
_ATEN_MATMUL = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
                "aten::dot", "aten::vdot", "aten::mv", "aten::addmv", "aten::linear", "aten::_scaled_mm",
                "aten::_int_mm", "aten::einsum", "aten::tensordot", "aten::inner", "aten::outer")
_MATMUL_CAUSE = ("this step grades your kernels: the matrix products of attention (S = Q K^T, O = P V, and "
                 "the backward's dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q) run in them with tl.dot, "
                 "not in PyTorch")
_ATTN_CAUSE = ("this step grades your own attention, so PyTorch's attention may not be called from "
               "it: compute S = scale * Q K^T, the softmax and O = P V yourself, as the task says")
_SOFTMAX_CAUSE = ("a softmax over all {skv} keys at once materialises the full score matrix, which "
                  "is vanilla attention: loop over key tiles K_j, V_j and keep the running max m_i "
                  "and sum l_i (online softmax) instead")
_KV_COPY_CAUSE = ("K and V copied once per query head (GQA expanded outside the kernel): with GQA, query head h "
                  "reads KV head h // (Hq // Hkv) inside the kernel, from the K and V it was given; the copies "
                  "cost the memory and the bandwidth GQA exists to save")
# Step 14's exp2_poly computes 2^x on the FMA pipes: every PyTorch route to an exponential (in place or not,
# any overload; pow only with a tensor exponent or a scalar base: x ** 3 is a polynomial)
_ATEN_EXP = {"aten::exp", "aten::exp2", "aten::expm1", "aten::special_exp2", "aten::special_expm1", "aten::ldexp",
             "aten::float_power", "aten::sigmoid", "aten::special_expit", "aten::tanh", "aten::sinh", "aten::cosh",
             "aten::logsumexp", "aten::logaddexp", "aten::logaddexp2", "aten::softplus", "aten::elu", "aten::celu",
             "aten::selu", "aten::silu", "aten::mish", "aten::gelu", "aten::erf", "aten::erfc", "aten::polar",
             # ops whose result is an exponential of their input in disguise: glu's sigmoid, the softmax
             # backwards (log_softmax's returns e^y), the masked softmax, losses on logits, Bessel's scaled forms
             "aten::glu", "aten::_log_softmax_backward_data", "aten::_softmax_backward_data", "aten::_masked_softmax",
             "aten::log_sigmoid", "aten::log_sigmoid_forward", "aten::binary_cross_entropy_with_logits",
             "aten::soft_margin_loss", "aten::multilabel_soft_margin_loss", "aten::kl_div", "aten::poisson_nll_loss",
             "aten::special_erfcx", "aten::special_log_ndtr", "aten::special_ndtr", "aten::i0", "aten::special_i0e",
             "aten::special_i1", "aten::special_i1e"} \
    | set(_ATEN_SOFTMAX)
_EXP_CAUSE = ("this exercise computes 2^x itself, as FlashAttention-4 does on the FMA pipes: the range reduction, "
              "a polynomial for 2^f and the exponent bits. PyTorch's exponentials (exp, exp2, pow with a tensor "
              "exponent, ldexp, sigmoid, ...) may not be called from it")
# e^x under more names: a 1x1 matrix exponential, Q(1, t) = e^-t, ratios of Bessel functions, 2^-s = zeta(s, 2) -
# zeta(s, 3), CTC's gradient; and every listed op's _foreach_, _backward, _forward and _jvp forms (elu's gradient is e^x)
_ATEN_EXP |= {"aten::linalg_matrix_exp", "aten::matrix_exp", "aten::igamma", "aten::igammac", "aten::special_zeta",
              "aten::_ctc_loss", "aten::ctc_loss"} | {f"aten::special_{s}modified_bessel_{k}" for s in ("", "scaled_")
                                                       for k in ("i0", "i1", "k0", "k1")}
_EXP_FORMS = re.compile(r"aten::(?:_foreach_)?(.*?)(?:_backward|_forward|_jvp)?_?")
_EXP_POW = {"aten::pow.Scalar", "aten::pow.Tensor_Tensor", "aten::pow_.Tensor", "aten::pow.Scalar_out",
            "aten::pow.Tensor_Tensor_out", "aten::_foreach_pow.List", "aten::_foreach_pow_.List",
            "aten::_foreach_pow.ScalarAndTensor"}
_RNN = ("lstm", "gru", "rnn")           # recurrent layers run sigmoid and tanh inside one fused kernel


def _exponential(name: str) -> bool:
    """Whether the aten operator ``name`` (overload included) computes an exponential of its input."""
    op = name.split(".")[0]
    form = _EXP_FORMS.fullmatch(op)
    core = f"aten::{form.group(1)}" if form else op
    return op.rstrip("_") in _ATEN_EXP or core in _ATEN_EXP or name in _EXP_POW or any(r in core for r in _RNN)


#: More values than this, read by exp2_poly but not computed from x in the call, are a table (a polynomial's
#: coefficients fit in fewer); as many of x's values may leave PyTorch as Python numbers (a test, a print)
FEW_VALUES = 8
_EXITS = {"tolist", "numpy", "__array__", "__dlpack__", "data_ptr", "untyped_storage", "storage", "_typed_storage"}
_OUTSIDE_CAUSE = ("NumPy, math and Python's ** compute exponentials where the grader cannot see them: exp2_poly "
                  "computes 2^x in PyTorch, on tensors, with arithmetic, floor, clamp and bit operations")
_TABLE_CAUSE = ("a table of powers made before the call (by an exponential the grader did not see), from Python "
                "numbers or from NumPy is an exponential in disguise: compute 2^n in the exponent bits and 2^f with "
                f"your polynomial, its coefficients Python floats (or a tensor of at most {FEW_VALUES})")
_COMPLEX_CAUSE = ("complex numbers hide an exponential (cos(i t) = cosh t): exp2_poly works on float32 values and "
                  "their int32 bits")


def _tensors(obj) -> list:
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def _storage_key(t: torch.Tensor) -> int:
    with torch._C.DisableTorchFunction():          # (inside the guard's own modes: not the student's call)
        return t.untyped_storage().data_ptr()


#: What a guarded call with ``forbid_kv_copies`` may allocate besides its outputs (o like q, lse): one copy
#: of each input (a .contiguous() of q, k or v) and this much more.
KV_COPY_SLACK = 64 * 1024


def _softmax_dim(args, kwargs, aten: bool):
    if aten:
        return args[1] if len(args) > 1 else kwargs.get("dim", -1)
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    return -1 if dim is None else dim


class _Watch:
    """Shared state of one guarded call: the score shape, what was seen, whether softmax is allowed."""

    def __init__(self, name: str, skv: int | set, allow_softmax: bool, forbid_matmul: bool = False, kv=None,
                 budget=None, forbid_exp: bool = False):
        self.name, self.skv, self.allow_softmax = name, skv, allow_softmax
        self.forbid_matmul, self.forbid_exp = forbid_matmul, forbid_exp
        self.violations: list[str] = []
        # forbid_kv_copies: the elements of k's and v's storages, every storage seen, the bytes the call may allocate
        self.kv = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() // t.element_size() for t in kv or ()}
        self.seen = set(self.kv)
        self.budget, self.allocated = budget, 0
        # forbid_exp: the storages the call was given or computed, how many values it took out of PyTorch
        self.made: set = set()
        self.values_out = 0

    def allocations(self, func, args, out) -> None:
        """Under forbid_kv_copies: an op on K or V whose result holds more elements than K or V
        (repeat_interleave, index_select, cat, an expanded view copied; a change of dtype is not one), or
        more new memory in all than the call's outputs and one copy of each input."""
        from torch.utils._pytree import tree_flatten

        new = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)
               and t.untyped_storage().data_ptr() not in self.seen]
        if not new:
            return
        grown = max(t.untyped_storage().nbytes() // t.element_size() for t in new)
        for a in tree_flatten((args,))[0]:
            if isinstance(a, torch.Tensor) and self.kv.get(a.untyped_storage().data_ptr(), grown) < grown:
                self.flag(f"{func.name()} on K or V, making it {grown / max(self.kv[a.untyped_storage().data_ptr()], 1):.1f}x "
                          "larger", _KV_COPY_CAUSE)
        for t in new:
            self.seen.add(t.untyped_storage().data_ptr())
            self.allocated += t.untyped_storage().nbytes()
        if self.allocated > self.budget:
            self.flag(f"memory for {self.allocated / 2**20:.2f} MiB of new tensors, more than its outputs and one "
                      f"copy of q, k and v ({self.budget / 2**20:.2f} MiB)", "K and V copied once per query head? "
                      + _KV_COPY_CAUSE.split(": ", 1)[1])

    def took_out(self, api: str, n: int) -> None:
        """Under forbid_exp: ``n`` more values left PyTorch (as Python numbers or NumPy's) through ``api``."""
        self.values_out += n
        if self.values_out > FEW_VALUES:
            self.flag(f"{api}, taking {self.values_out} values out of PyTorch", _OUTSIDE_CAUSE)

    def reads(self, name: str, args) -> None:
        """Under forbid_exp: each tensor an op reads was given to the call, computed in it, or is a few values."""
        for t in _tensors(args):
            if t.numel() > FEW_VALUES and _storage_key(t) not in self.made:
                self.flag(f"{name} on a tensor of {t.numel()} values that it did not compute from its input in "
                          "this call", _TABLE_CAUSE)

    def flag(self, api: str, cause: str) -> None:
        msg = (f"[anti-cheat] {self.name} called {api} while it was being graded.\n"
               f"  likely cause: {cause}")
        self.violations.append(msg)
        raise CheatDetected(msg)

    def softmax(self, api: str, x, dim) -> None:
        if self.allow_softmax or not isinstance(x, torch.Tensor) or x.dim() < 2:
            return
        try:
            width = x.shape[dim]
        except (IndexError, TypeError):
            return
        widths = self.skv if isinstance(self.skv, (set, frozenset)) else {self.skv}
        if width > MIN_KEYS and width in widths:
            self.flag(f"{api} over all {width} keys", _SOFTMAX_CAUSE.format(skv=width))


class _Watching:
    """A torch mode that reports to one _Watch (the base of both guards below)."""

    def __init__(self, watch: _Watch):
        super().__init__()
        self.watch = watch


class _FunctionGuard(_Watching, TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SDPA_FUNCS:
            self.watch.flag(_SDPA_FUNCS[func], _ATTN_CAUSE)
        if func in _SOFTMAX_FUNCS and args:
            self.watch.softmax(_SOFTMAX_FUNCS[func], args[0], _softmax_dim(args, kwargs, False))
        if (self.watch.forbid_exp and getattr(func, "__name__", None) in _EXITS and args
                and isinstance(args[0], torch.Tensor)):
            self.watch.took_out(f"Tensor.{func.__name__}", args[0].numel())
        return func(*args, **kwargs)


def _dynamo_off(fn):
    """``torch._disable_dynamo(fn, recursive=True)``, as torch wraps every dispatch mode, but lazily: the
    first call of torch's wrapper imports torch._dynamo (over a CPU-second in each grading kernel), and in
    a process that never imported it nothing is being compiled. Once loaded, it stays disabled."""
    disabled = None

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        nonlocal disabled
        if disabled is None and "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        if disabled is None:
            disabled = torch._disable_dynamo(fn, recursive=True)
        return disabled(*args, **kwargs)

    return inner


class _LazyDynamoMode(TorchDispatchMode):
    """A dispatch mode whose __torch_dispatch__ its subclass wraps in _dynamo_off, not in torch's wrapper."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class _DispatchGuard(_Watching, _LazyDynamoMode):
    @_dynamo_off
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        if any(s in name for s in _ATEN_ATTENTION):
            self.watch.flag(f"PyTorch's attention kernel ({name})", _ATTN_CAUSE)
        if self.watch.forbid_matmul and name.split(".")[0] in _ATEN_MATMUL:
            self.watch.flag(f"a PyTorch matrix product ({name})", _MATMUL_CAUSE)
        if self.watch.forbid_exp:
            if _exponential(name):
                self.watch.flag(f"a PyTorch exponential ({name})", _EXP_CAUSE)
            if name == "aten::_local_scalar_dense" and args[0].is_floating_point():
                self.watch.took_out("item() or float()", 1)
            self.watch.reads(name, (args, kwargs))
        if name.split(".")[0] in _ATEN_SOFTMAX and args:
            self.watch.softmax(name.split(".")[0], args[0], _softmax_dim(args, kwargs, True))
        out = func(*args, **kwargs)
        if self.watch.forbid_exp:
            if any(t.is_complex() for t in _tensors(out)):
                self.watch.flag(f"{name} on complex numbers", _COMPLEX_CAUSE)
            self.watch.made |= {_storage_key(t) for t in _tensors(out)}
        if self.watch.budget is not None:
            self.watch.allocations(func, (args, kwargs), out)
        return out


# the matrix products torch.utils.flop_counter counts as 2 m n k each (times the batch), and where their
# two factors are among the operator's arguments
_PRODUCTS = {torch.ops.aten.mm: (0, 1), torch.ops.aten.addmm: (1, 2), torch.ops.aten.bmm: (0, 1),
             torch.ops.aten.baddbmm: (1, 2), torch.ops.aten._scaled_mm: (0, 1)}


class MatmulFlops(_LazyDynamoMode):
    """The FLOPs of the matrix products run while it is active, as PyTorch's FlopCounterMode counts them.
    FlopCounterMode imports torch._dynamo (over a CPU-second in a grading kernel) and then wraps every
    operator call in Dynamo's disable, which made step 04's tile-skipping test about ten times slower."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    @_dynamo_off
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        factors = _PRODUCTS.get(func.overloadpacket)
        if factors is not None:
            a, b = args[factors[0]].shape, args[factors[1]].shape
            self.flops += 2 * a.numel() * b[-1]
        return out


@contextlib.contextmanager
def framework_attention_forbidden(name: str = "the entry point", skv: int | set = 0,
                                  allow_softmax: bool = False, forbid_matmul: bool = False, kv=None, budget=None,
                                  forbid_exp: bool = False):
    """While the block runs, PyTorch's attention (and a softmax over all ``skv`` keys unless
    ``allow_softmax``) raises :class:`CheatDetected`; a hidden violation is raised at the end. With
    ``kv`` (the call's k and v) and ``budget`` (bytes), so does copying K or V into something larger, or
    allocating more than ``budget`` bytes of new tensors in all; with ``forbid_exp``, any PyTorch exponential."""
    watch = _Watch(name, skv, allow_softmax, forbid_matmul, kv, budget, forbid_exp)
    mha = torch.nn.MultiheadAttention.forward

    def forbidden_mha(*args, **kwargs):
        watch.flag("torch.nn.MultiheadAttention", _ATTN_CAUSE)

    torch.nn.MultiheadAttention.forward = forbidden_mha
    try:
        with _FunctionGuard(watch), _DispatchGuard(watch):
            yield watch
    finally:
        torch.nn.MultiheadAttention.forward = mha
    if watch.violations:            # raised inside, but the student's code caught it
        raise CheatDetected(watch.violations[0] + "\n  (the error was caught inside the function; "
                            "it still counts)")


_NO_TRITON_CAUSE = ("this step grades your Triton kernels, launched from the entry point (kernel[grid](...)), which "
                    "read the inputs; an answer computed with PyTorch operations is not the exercise")
#: the inputs a Triton step's kernels must read, by position in the guarded call (step 08's call is forward and
#: backward together: its fourth argument is dO, which only a backward kernel reads)
_INPUT_NAMES = ("q", "k", "v", "dO")


def _storages(x, out: set) -> set:
    """The storages of the tensors in ``x`` (a tensor, a host-side tensor descriptor, or a list of them)."""
    if isinstance(x, torch.Tensor):
        out.add(x.untyped_storage().data_ptr() or None)          # (an empty tensor's 0 matches nothing)
    elif isinstance(getattr(x, "base", None), torch.Tensor):
        out.add(x.base.untyped_storage().data_ptr() or None)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _storages(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _storages(y, out)
    return out


class _Provenance(_LazyDynamoMode):
    """Which storages hold data derived from each input: an op that reads a derived storage makes its outputs
    derived too (a copy, a cast, ``.contiguous()``, an in-place ``copy_`` into a buffer)."""

    def __init__(self, inputs: dict):
        super().__init__()
        self.derived = {name: _storages(t, set()) for name, t in inputs.items()}

    @_dynamo_off
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        read = _storages([args, kwargs or {}], set())
        for stores in self.derived.values():
            if stores & read:
                _storages(out, stores)
        return out


@contextlib.contextmanager
def triton_launches():
    """Records the Triton kernels launched while the block runs (compiled or in the interpreter, autotuned or
    not, or a kernel compiled ahead with ``warmup`` and launched as ``compiled[grid](...)``): yields a list of
    (kernel name, the storages of its tensor arguments)."""
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    seen: list = []
    originals = {(JITFunction, "run"): JITFunction.run, (InterpretedFunction, "run"): InterpretedFunction.run,
                 (CompiledKernel, "__getitem__"): CompiledKernel.__getitem__}

    def counting(run):
        @functools.wraps(run)
        def wrapper(self, *args, **kwargs):
            seen.append((getattr(self, "__name__", "kernel"), _storages([args, kwargs], set())))
            return run(self, *args, **kwargs)
        return wrapper

    def counting_grid(getitem):
        @functools.wraps(getitem)
        def wrapper(self, grid):
            runner = getitem(self, grid)

            def launch(*args, **kwargs):
                seen.append((getattr(self, "name", "kernel"), _storages([args, kwargs], set())))
                return runner(*args, **kwargs)
            return launch
        return wrapper

    for (cls, attr), fn in originals.items():
        setattr(cls, attr, counting_grid(fn) if attr == "__getitem__" else counting(fn))
    try:
        yield seen
    finally:
        for (cls, attr), fn in originals.items():
            setattr(cls, attr, fn)


@contextlib.contextmanager
def kernels_read_inputs(name: str, inputs: dict):
    """While the block runs, the Triton kernels launched are recorded and the data derived from each of
    ``inputs`` followed; afterwards each input must have reached some kernel's arguments, else
    :class:`CheatDetected` names those that did not."""
    with triton_launches() as seen, _Provenance(inputs) as prov:
        yield
    read = set().union(*(stores for _, stores in seen)) - {None} if seen else set()
    missed = [n for n, stores in prov.derived.items() if not stores & read]
    if missed:
        what = "no Triton kernel ran during the call" if not seen else (
            f"no Triton kernel read {', '.join(missed)} (kernels launched: "
            f"{', '.join(dict.fromkeys(k for k, _ in seen))})")
        raise CheatDetected(f"[anti-cheat] {name}: {what}: {_NO_TRITON_CAUSE}")


def _key_lengths(args: tuple, at: int, offsets: bool) -> set:
    """The keys each sequence's rows see, from the call's positional argument ``at`` (the contract's place, not
    the student's parameter name): cumulative ``offsets`` (cu_seqlens_k) or the lengths themselves (seq_lens)."""
    t = args[at] if at < len(args) else None
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.is_floating_point():
        return set()
    return {int(n) for n in (t.diff() if offsets else t).tolist()}


def forbid_framework_attention(fn, allow_softmax: bool = False, forbid_matmul: bool = False,
                               forbid_kv_copies: bool = False, require_triton: int = 0, key_lengths=()):
    """``fn`` wrapped so that it may not call PyTorch's attention while it runs (see module doc).

    Step 01 (vanilla attention) passes ``allow_softmax=True``: it may use ``torch.softmax`` but not
    SDPA. Steps 04 and later use the default, which also forbids a softmax over the whole row.
    Step 08 adds ``forbid_matmul=True``: its kernels compute every matrix product (PyTorch's
    matmul family, at the dispatcher, raises); the guard covers its forward and its backward.
    ``require_triton`` (steps 05, 08-10, 15, whose exercise is a Triton kernel): that many of the call's first
    tensor arguments (3: q, k, v; 4, dO too: step 08's forward and backward in one call) must each reach a Triton
    kernel's arguments, as they are or as data derived from them (``kernels_read_inputs``).
    ``key_lengths`` (steps 09 and 15: packed or paged K and V), ``(position, "offsets" or "lengths")``: the
    call's argument that gives each sequence's keys (``cu_seqlens_k`` or ``seq_lens``); a softmax over that many
    keys is a whole row too.
    Step 05 adds ``forbid_kv_copies=True``: GQA is the kernel's (query head h reads KV head h // G), so
    a call that makes K or V larger (one copy per query head, around a multi-head kernel such as the
    lecture's) raises, and so does one that allocates more than its outputs (o, lse) and one copy of
    each input, plus ``KV_COPY_SLACK``.
    """
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "the entry point")

    @functools.wraps(fn)
    def guarded(q, k, v, *args, **kwargs):
        skv = k.shape[-2] if isinstance(k, torch.Tensor) and k.dim() >= 2 else 0
        if key_lengths:
            skv = _key_lengths((q, k, v, *args), key_lengths[0], key_lengths[1] == "offsets")
        kv = budget = None
        if forbid_kv_copies and all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            nbytes = lambda t: t.untyped_storage().nbytes()                    # noqa: E731
            kv = (k, v)
            lse = q.numel() // max(q.shape[-1], 1) * 4
            budget = 2 * q.numel() * q.element_size() + lse + nbytes(k) + nbytes(v) + KV_COPY_SLACK
        given = dict(zip(_INPUT_NAMES, (q, k, v, *args)))
        need = {n: t for n, t in list(given.items())[:require_triton]
                if isinstance(t, torch.Tensor) and t.numel()}
        launches = kernels_read_inputs(name, need) if need else contextlib.nullcontext()
        with launches, framework_attention_forbidden(name, skv, allow_softmax, forbid_matmul, kv, budget):
            return fn(q, k, v, *args, **kwargs)

    return guarded


def forbid_exponentials(fn):
    """``fn`` wrapped so that it may not reach any PyTorch exponential while it runs (step 14's exp2_poly:
    ``_ATEN_EXP``, at the dispatcher, so every alias and ``torch.ops.aten`` route is covered); a call the
    student's code catches is still reported when it returns. Nor may it compute where the dispatcher does not
    look: take more than ``FEW_VALUES`` of its values out of PyTorch (``tolist``, ``numpy``, ``item``: NumPy,
    ``math`` or Python's ``**`` would do the exponentials), read a tensor of more values that the call neither
    was given nor computed (a table of powers made beforehand), compute on complex numbers, or return a result
    that no operation of the call produced."""
    name = getattr(fn, "__name__", "the entry point")

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        with framework_attention_forbidden(name, allow_softmax=True, forbid_exp=True) as watch:
            watch.made |= {_storage_key(t) for t in _tensors((args, kwargs))}
            out = fn(*args, **kwargs)
            for t in _tensors(out):
                if t.numel() > FEW_VALUES and _storage_key(t) not in watch.made:
                    watch.flag(f"no PyTorch operation for its result ({t.numel()} values from NumPy, Python or "
                               "another thread)", _OUTSIDE_CAUSE)
        return out

    return guarded


# ----------------------------------------------------------------------------- caching
def _out(result):
    if isinstance(result, (tuple, list)) and len(result) == 2:
        return result[0], result[1]
    return result, None


def _snapshot(o, lse):
    o2 = o.detach().clone() if isinstance(o, torch.Tensor) else o
    l2 = lse.detach().clone() if isinstance(lse, torch.Tensor) else lse
    return o2, l2


def _same(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and bool(torch.equal(a, b)))


def check_no_caching(fn, config: str = "medium", *, expect_lse: bool = False, device=None, dtype=None,
                     layout: str = "bshd", verbose: bool = True, seed: int | None = None) -> None:
    """Call ``fn`` four times and check every result against the reference:

    1. on fresh inputs A, 2. on fresh inputs B of the same shape (a cache keyed by shape or by
    the call count fails here), 3. on B again (the same inputs twice must give the right answer
    again), 4. on A's tensors refilled in place with new values (a cache keyed by tensor identity
    or data pointer fails here). The output of call 1 must not change during calls 2-4 (a shared
    output buffer would hand the caller a result that later calls overwrite).
    Raises :class:`CheatDetected` when a wrong result equals an earlier one, and the check's own
    :class:`AttentionCheckError` when a result is simply wrong.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = get_config(config, device) if isinstance(config, str) else config
    base = secrets.randbits(31) if seed is None else int(seed)
    seeds = [(base + i * 7919) % 2**31 for i in range(3)]          # three different draws
    A = make_inputs(cfg, seeds[0], device, dtype, layout)
    B = make_inputs(cfg, seeds[1], device, dtype, layout)
    C = make_inputs(cfg, seeds[2], device, dtype, layout)
    A0 = [t.clone() for t in A]     # A's values, kept for checking call 1 after A is refilled
    calls = []   # (label, input name, seed, q, k, v, output as returned, snapshot of (o, lse))

    def call(label, name, q, k, v, seed):
        result = _out(fn(q, k, v, causal=cfg.causal))
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        calls.append((label, name, seed, q, k, v, result, _snapshot(*result)))

    call("first call (fresh inputs A)", "A", *A, seeds[0])
    call("second call (fresh inputs B, same shape)", "B", *B, seeds[1])
    call("third call (inputs B again)", "B", *B, seeds[1])
    with torch.no_grad():
        for t, new in zip(A, C):
            t.copy_(new)        # A's tensors, same addresses, new values
    call("fourth call (A's tensors refilled in place with new values)", "C", *A, seeds[2])
    for label, name, seed, _q, _k, _v, _result, (o_snap, lse_snap) in calls:
        q, k, v = {"A": A0, "B": B, "C": C}[name]
        try:
            check_attention(o_snap, q, k, v, cfg.causal, None, lse_snap if expect_lse else None,
                            config=f"{cfg.name}, {label}", seed=seed)
        except AttentionCheckError as err:
            for label2, name2, *_, (o2, _) in calls:
                if name2 != name and _same(o_snap, o2) and bool(o_snap.abs().amax() > 0):
                    raise CheatDetected(
                        f"[anti-cheat] {cfg.name}: the {label} returned exactly the output of the "
                        f"{label2}, although the inputs differ.\n  likely cause: the function "
                        "returns a cached or precomputed result; it must compute the output from "
                        "the inputs it is given, on every call") from err
            # Same values in new tensors: a right answer now means the wrong one came from state
            # kept between calls (a cache keyed by address, shape or call count).
            fresh = [t.clone() for t in (q, k, v)]
            try:
                o_re, lse_re = _out(fn(*fresh, causal=cfg.causal))
                check_attention(o_re, *fresh, cfg.causal, None, lse_re if expect_lse else None,
                                config=f"{cfg.name}, {label}, repeated on copies")
            except AttentionCheckError:
                raise err from None
            raise CheatDetected(
                f"[anti-cheat] {cfg.name}: the {label} gave a wrong result, and the same values "
                "in new tensors give the right one.\n  likely cause: the function keeps results "
                "between calls (keyed by tensor address, shape or call count); it must compute "
                "the output from the inputs it is given, on every call") from err
    o1, (o1_snap, _) = calls[0][6][0], calls[0][7]
    if isinstance(o1, torch.Tensor) and not _same(o1, o1_snap):
        raise CheatDetected(
            f"[anti-cheat] {cfg.name}: the output returned by the first call changed during later "
            "calls.\n  likely cause: the function returns the same output buffer every call; "
            "allocate a new output tensor per call")
    if verbose and not is_collecting():
        print(f"[{cfg.name}] no caching: 4 calls on fresh, repeated and refilled inputs all right")


# ----------------------------------------------------------------------------- roofline
#: Peak dense fp16/bf16 tensor-core throughput (TFLOP/s, no sparsity) from the vendors' data sheets.
PEAK_TFLOPS = {"H200": 989, "H100 SXM": 989, "H100 80GB HBM3": 989, "GH200": 989, "H800": 989,
               "H100 PCIe": 756, "H100 NVL": 835, "H100": 989, "B200": 2250, "B100": 1750,
               "A100": 312, "A800": 312, "A10G": 70, "A10": 125, "A30": 165, "L40S": 362, "L40": 181,
               "L4": 121, "RTX 6000 Ada": 364, "RTX 4090": 165, "RTX 4080": 97, "RTX 3090": 71,
               "RTX A6000": 155, "V100": 125, "T4": 65}


def peak_tflops(gpu_name: str) -> float | None:
    """The data-sheet peak for ``gpu_name`` (longest matching key), None when unknown."""
    hits = [k for k in PEAK_TFLOPS if k.lower() in gpu_name.lower()]
    return float(PEAK_TFLOPS[max(hits, key=len)]) if hits else None


def measured_gemm_tflops(n: int = 8192, dtype=torch.float16) -> float:
    """Dense GEMM throughput measured here (best of 5): the ceiling when the data sheet is unknown."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    best = float("inf")
    for _ in range(6):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e))
    return 2 * n ** 3 / best / 1e9


def roofline_verdict(tflops: float, gpu_name: str, ceiling: float | None = None) -> str | None:
    """None when ``tflops`` is physically possible on ``gpu_name``; else a sentence saying why not.

    The ceiling is the data-sheet peak (or 1.5x a dense GEMM measured here when the GPU is not in
    the table) with 5% slack: attention is two GEMMs plus a softmax and cannot beat that peak.
    """
    if ceiling is None:
        ceiling = peak_tflops(gpu_name)
        source = "data-sheet peak"
        if ceiling is None:
            ceiling = 1.5 * measured_gemm_tflops()
            source = "1.5x a dense fp16 GEMM measured here"
    else:
        source = "given ceiling"
    if tflops > 1.05 * ceiling:
        return (f"{tflops:.0f} TFLOP/s is above what {gpu_name} can compute ({source}: "
                f"{ceiling:.0f} TFLOP/s): the timing cannot be right. Likely causes: work launched on "
                "another CUDA stream, work skipped, or a result cached between calls")
    return None


#: Data-sheet HBM bandwidth (GB/s) of the GPUs a class meets (longest matching key wins).
PEAK_GBPS = {"H200": 4800, "H100 SXM": 3350, "H100 80GB HBM3": 3350, "GH200": 4000, "H800": 3350,
             "H100 PCIe": 2000, "H100 NVL": 3900, "H100": 3350, "B200": 8000, "A100-SXM4-80GB": 2039,
             "A100 80GB PCIe": 1935, "A100": 1555, "A10G": 600, "A10": 600, "L40S": 864, "L40": 864,
             "L4": 300, "RTX 4090": 1008, "RTX 3090": 936, "RTX A6000": 768, "V100": 900, "T4": 320}


def bandwidth_verdict(gbps: float, gpu_name: str) -> str | None:
    """None when reading at ``gbps`` is physically possible on ``gpu_name``; else why not. A decode
    reads every key and value once, so it cannot beat the data-sheet bandwidth (unknown GPUs: 1.5x
    a device-to-device copy measured here, which counts what it reads and what it writes)."""
    hits = [k for k in PEAK_GBPS if k.lower() in gpu_name.lower()]
    if hits:
        ceiling, source = float(PEAK_GBPS[max(hits, key=len)]), "data-sheet bandwidth"
    else:
        from facourse.decode import copy_rate_gbps
        ceiling, source = 1.5 * copy_rate_gbps(), "1.5x a copy measured here"
    if gbps > 1.05 * ceiling:
        return (f"reading K and V at {gbps:.0f} GB/s is faster than {gpu_name}'s memory ({source}: "
                f"{ceiling:.0f} GB/s): the timing cannot be right. Likely causes: work launched on another "
                "CUDA stream, keys skipped, or a result cached between calls")
    return None
