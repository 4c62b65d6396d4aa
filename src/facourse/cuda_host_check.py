"""Steps 06 and 07 without a GPU: which device functions are still the stub, and what each written one computes.

    from facourse.cuda_host_check import check_device_functions, unwritten_functions
    unwritten_functions("student_kernel.cu")          # ["qk_tile", ...]: bodies still marked FA_TODO
    check_device_functions("student_kernel.cu")       # prints one line per function; raises HostCheckError

The step is told by the file: a ``student_kernel.cu`` that includes ``hopper_common.cuh`` is step 07's,
any other step 06's. Both compile the student's file with g++ against a host stand-in of the step's
primitives (``facourse.cuda_host_shim``) and run each device function on emulated hardware, against a
NumPy reference; a wrong output is compared with the classic mistakes to name the cause. What only a
GPU checks is said in the output. The build is cached by the sources' hash.

**Step 06** (a warp is 32 threads in lockstep; ``ldmatrix``, ``mma.sync``, ``cp.async`` and the
shuffles emulated after the PTX ISA's tables): the four device functions on one warp's fragments:

* ``load_tile_async``: tiles of 64 and 128 rows, D = 64 and 128, strided rows, rows past ``rows_valid``;
  read back through ``swizzle<D>``; what ``cp_async_16`` read and wrote is checked;
* ``qk_tile``: S = Q K^T of 16 query rows and 64 keys (the harness's Q fragments);
* ``online_softmax_update``: five calls that each isolate a step (the first tile, a growing max: alpha,
  a steady max, rows that have seen no key, a masked tile after keys);
* ``pv_tile``: O += P V, P rounded to fp16 as ``pack2`` does.

Named mistakes: no alpha rescale of O or l, no -inf guard, no scale, a row max not reduced over its
quad, rows past ``rows_valid`` not zero-filled, no swizzle, ...

**Step 07** (one CTA of 384 threads runs the given kernel of ``hopper_harness.cuh``; TMA, mbarriers,
WGMMA and named barriers emulated after the PTX ISA, see ``cuda_host_shim``): the four functions the
student writes are mostly *orchestration* (the arithmetic around them, softmax, mask, epilogue, is
given), so the check runs them as the kernel does, each side of the K/V ring against an oracle:

* ``producer``: the student's producer with oracle consumers that wait, check what landed in each slot
  and release, on two problems (GQA, causal with row blocks of no key, ragged lengths, D = 64 and 128,
  the ring wrapping many times); its calls are compared with the schedule: which tiles, which key
  blocks in which order, coordinates, slots, barriers, bytes announced, the waits for empty slots and
  their parities;
* ``gemm_qk`` and ``gemm_pv``: one warpgroup, the products read through the student's descriptors;
  S = Q K^T and O += P V against NumPy, the descriptors against the layout (panels, 32-byte k-steps,
  16-key-row steps, leading and stride offsets, accumulate flags, which p[kk]);
* ``consumer_mainloop``: the student's consumers with an oracle producer on three problems (fp16 and
  bf16, causal with the diagonal inside a warpgroup's rows, rows with no key, a tile skipped, ragged
  lengths, five key blocks): O and lse against NumPy, the ring protocol checked as it runs (waits before
  reads, releases after the wgmma_wait, parities, accumulators and P untouched while in flight, fences,
  commits, GEMM turns); a deadlock is reported with what each thread waits for.

Named mistakes: GQA's head map, key blocks left to right, causal block count, tiles with no key block
not skipped, block instead of element coordinates, a ring position restarted per tile, one panel only,
bytes announced, a missing or wrong-parity wait, descriptors' panel and k-step offsets, accumulate
flags, no fence or commit, reading S or changing O or P in flight, releasing a slot early or from
every lane, masks on the wrong blocks or rows, no rescale of O, the last O += P V missing, ...
"""
from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .cuda_host_shim import DRIVER, HARNESS_ROUTING, HOPPER_DRIVER, HOPPER_SHIM, SHIM

__all__ = ["FUNCTIONS", "GPU_ONLY", "HOPPER_FUNCTIONS", "HOPPER_GPU_ONLY", "HostBuild", "HostCheckError",
           "HostCheckReport", "build_host_driver", "check_device_functions", "prebuild_host_check",
           "report_unwritten", "step_of", "unwritten_functions"]

#: step 06's four device functions, in the order the kernel calls them
FUNCTIONS = ("load_tile_async", "qk_tile", "online_softmax_update", "pv_tile")
#: step 07's four functions, in the order of student_kernel.cu
HOPPER_FUNCTIONS = ("producer", "gemm_qk", "gemm_pv", "consumer_mainloop")

GPU_ONLY = ("What only a GPU checks: the real instructions (cp.async, ldmatrix, mma.sync and the shuffles "
            "run here as a C++ emulation of the PTX ISA's tables, in fp32), the whole kernel with the "
            "harness (the cp.async pipeline and its waits, __syncthreads, masks, the epilogue), the graded "
            "configurations and edge cases, bf16, and speed. The graded tests run on a GPU.")
HOPPER_GPU_ONLY = ("What only an H100/H200 checks: the real instructions (TMA, the mbarriers, WGMMA and the named "
                   "barriers run here as a C++ emulation of the PTX ISA, one CTA on the CPU, each product computed "
                   "in fp32 at its wgmma_wait), their timing and overlap (ping-pong, wgmma_wait<1>), setmaxnreg and "
                   "the register budget, what the compiler does around pin_registers, many CTAs at once (the "
                   "persistent scheduler's counter), the tensor maps' encoding, the graded configurations at full "
                   "size, the structural check of the SASS (HGMMA, UTMALDG) and speed against cuDNN. The graded "
                   "tests run on an H100/H200.")


class HostCheckError(AssertionError):
    """A device function computes something wrong on the CPU check (or is not written yet)."""


# ----------------------------------------------------------------------------- the step, the stub's marker
def _read(source) -> str:
    return Path(source).read_text() if not (isinstance(source, str) and "\n" in source) else source


def step_of(source) -> str:
    """"07" for a student_kernel.cu that includes hopper_common.cuh, else "06" (a path or the text)."""
    return "07" if re.search(r'#include\s+"hopper_common\.cuh"', _strip_comments(_read(source))) else "06"


def _functions(source) -> tuple[str, ...]:
    return HOPPER_FUNCTIONS if step_of(source) == "07" else FUNCTIONS


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


_TODO = re.compile(r"\bFA_TODO\s*\(\s*\"(\w+)\"\s*\)")


def unwritten_functions(source) -> list[str]:
    """Functions whose body still carries the stub's marker ``FA_TODO("name")`` (comments ignored).
    ``source``: a path to student_kernel.cu, or its text."""
    text = _read(source)
    functions = _functions(text)
    found = set(_TODO.findall(_strip_comments(text)))
    return [f for f in functions if f in found] + sorted(found - set(functions))


def report_unwritten(source) -> list[str]:
    """Print which functions are still the stub (nothing when all are written); return them."""
    todo = unwritten_functions(source)
    if todo:
        print(f"Not implemented yet ({len(todo)} of {len(_functions(source))}): {', '.join(todo)}. Their bodies are "
              "still the stub (the line FA_TODO(\"...\") marks it): write them, deleting that line as you do.")
    return todo


# ----------------------------------------------------------------------------- the host build
@dataclass
class HostBuild:
    ok: bool
    binary: Path | None
    log: str

    def errors(self, n: int = 8) -> list[str]:
        lines = [ln for ln in self.log.splitlines() if re.search(r"\berror\b", ln)]
        return (lines or self.log.strip().splitlines())[:n]


def _cache_root() -> Path:
    """Where host builds are kept, one folder per content hash ($FACOURSE_HOST_CHECK_CACHE overrides)."""
    return Path(os.environ.get("FACOURSE_HOST_CHECK_CACHE") or Path(tempfile.gettempdir()) / "facourse_host_check")


_FLAGS = ["-std=c++20", "-O1", "-pthread", "-w"]
_HOPPER_FLAGS = ["-std=c++20", "-O0", "-pthread", "-w"]   # its hot loops are FA_HOT (-O2): the build takes half


def _flags(files: dict[str, str]) -> list[str]:
    return _HOPPER_FLAGS if "hopper_primitives.cuh" in files else _FLAGS
_BUILDS: dict[str, Future] = {}          # content hash -> the build (running or done) of this process
_BUILDS_LOCK = threading.Lock()
_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="facourse_host_build")
_HOST = "// ============================================================================ host"


def _route_harness(text: str) -> str | None:
    """The device part of step 07's hopper_harness.cuh, its calls of producer and consumer routed so
    that the driver can put an oracle on either side (None when the file is not the given one)."""
    host, top = text.find(_HOST), text.find("namespace hfa {\n")
    if host < 0 or top < 0 or top > host:
        return None
    device = text[:host]
    device, n1 = re.subn(r"\bproducer<D>\(", "(fa_use_oracle_producer ? &fa_oracle_producer<D> : &producer<D>)(",
                         device)
    device, n2 = re.subn(r"\bconsumer<T, D>\((?=smem)",
                         "(fa_use_oracle_consumer ? &fa_oracle_consumer<T, D> : &consumer<T, D>)(", device)
    if n1 != 1 or n2 != 1:
        return None
    top += len("namespace hfa {\n")
    return device[:top] + HARNESS_ROUTING + device[top:] + "}  // namespace hfa\n"


def _build_files(source) -> dict[str, str] | str:
    """The files of the host build ({name: text}, the driver as driver.cpp), or why there is none."""
    text = Path(source).read_text()
    if step_of(text) == "06":
        return {"student_kernel.cu": text, "fa_primitives.cuh": SHIM,
                "fa_harness.cuh": "// (the host check runs the device functions alone)\n",
                "fa_params.h": "#pragma once\n#include <stdint.h>\n", "driver.cpp": DRIVER}
    folder = Path(source).resolve().parent
    given = {}
    for name in ("hopper_common.cuh", "hopper_harness.cuh", "fa_params.h"):
        if not (folder / name).exists():
            return f"{name} is not next to {Path(source).name} (the given files of the exercise must be there)"
        given[name] = (folder / name).read_text()
    harness = _route_harness(given["hopper_harness.cuh"])
    if harness is None:
        return "hopper_harness.cuh is not the given one (the host check runs its device part)"
    files = {"student_kernel.cu": text, "hopper_primitives.cuh": HOPPER_SHIM, "hopper_harness.cuh": harness,
             "hopper_common.cuh": given["hopper_common.cuh"], "fa_params.h": given["fa_params.h"],
             "driver.cpp": HOPPER_DRIVER}
    for empty in ("cuda.h", "cuda_bf16.h", "cuda_fp16.h", "cudaTypedefs.h", "cuda_runtime.h"):
        files[empty] = "#pragma once\n"
    return files


def _submit_build(source, cxx: str | None, timeout: float) -> Future | HostBuild:
    files = _build_files(source)
    if isinstance(files, str):
        return HostBuild(False, None, files)
    cxx = cxx or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return HostBuild(False, None, "no C++ compiler (g++) on this machine")
    key = hashlib.sha256("\0".join([*(f"{k}\0{v}" for k, v in sorted(files.items())), cxx, *_flags(files)]).encode()
                         ).hexdigest()[:20]
    with _BUILDS_LOCK:
        fut = _BUILDS.get(key)
        if fut is None or _stale(fut):
            fut = _BUILDS[key] = _POOL.submit(_build, files, cxx, key, timeout)
    return fut


def _stale(fut: Future) -> bool:
    """A finished build to do again: it raised, or its binary has gone (a cleaned temporary folder)."""
    if not fut.done():
        return False
    if fut.exception() is not None:
        return True
    res = fut.result()
    return res.ok and not res.binary.exists()


def prebuild_host_check(source, cxx: str | None = None, timeout: float = 180) -> None:
    """Start the CPU check's g++ build in the background and return at once (the notebook starts it
    before nvcc's compile check, so both compilers run at the same time)."""
    _submit_build(source, cxx, timeout)


def build_host_driver(source, cxx: str | None = None, timeout: float = 180) -> HostBuild:
    """g++ -std=c++20 of the student's file with the host shim and the step's driver; cached by content
    hash (on disk, and a build already under way in this process is waited for, not started again)."""
    fut = _submit_build(source, cxx, timeout)
    return fut if isinstance(fut, HostBuild) else fut.result()


def _std_header(files: dict[str, str], cxx: str) -> list[str]:
    """Step 07: the C++ standard headers its build includes, precompiled once per cache (a third of each
    build's time is parsing them); the flags that use the header, [] when it cannot be made."""
    if "hopper_primitives.cuh" not in files:
        return []
    text = "".join(sorted(set(re.findall(r"^#include <[^>]+>\n", files["hopper_primitives.cuh"] + files["driver.cpp"],
                                         re.M))))
    folder = _cache_root() / ("pch_" + hashlib.sha256("\0".join([text, cxx, *_flags(files)]).encode()).hexdigest()[:16])
    flags = ["-I", str(folder), "-include", "fa_std.h"]
    if (folder / "fa_std.h.gch").exists():
        return flags
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="pch_", dir=folder))
    try:
        (tmp / "fa_std.h").write_text(text)
        r = subprocess.run([cxx, *_flags(files), "-x", "c++-header", str(tmp / "fa_std.h"), "-o",
                            str(tmp / "fa_std.h.gch")], capture_output=True, timeout=120)
        if r.returncode != 0:
            return []
        if not (folder / "fa_std.h").exists():
            (tmp / "fa_std.h").replace(folder / "fa_std.h")
        (tmp / "fa_std.h.gch").replace(folder / "fa_std.h.gch")   # atomic: a concurrent build never sees half a file
        return flags
    except (OSError, subprocess.TimeoutExpired):
        return []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build(files: dict[str, str], cxx: str, key: str, timeout: float) -> HostBuild:
    out = _cache_root() / key
    binary = out / "fa_host_driver"
    if binary.exists():
        return HostBuild(True, binary, "cached")
    out.mkdir(parents=True, exist_ok=True)
    pch = _std_header(files, cxx)
    tmp = Path(tempfile.mkdtemp(prefix="build_", dir=out))
    try:
        for name, text in files.items():
            (tmp / name).write_text(text)
        cmd = [cxx, *_flags(files), *pch, "-I", str(tmp), str(tmp / "driver.cpp"), "-o", str(tmp / "fa_host_driver")]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return HostBuild(False, None, f"g++ did not finish in {timeout:.0f} s")
        if r.returncode != 0:
            return HostBuild(False, None, (r.stderr + r.stdout).replace(str(tmp) + "/", ""))
        (tmp / "fa_host_driver").replace(binary)       # atomic: a concurrent build never sees half a file
        return HostBuild(True, binary, r.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _RunError(RuntimeError):
    pass


def _run(binary: Path, args: list, data: bytes, timeout: float = 20) -> bytes:
    try:
        r = subprocess.run([str(binary), *map(str, args)], input=data, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise _RunError(f"it did not return within {timeout:.0f} s (a lane waiting at a shuffle the others "
                        "never reach? every lane of the warp must call the same shuffles)") from None
    if r.returncode != 0:
        msg = r.stderr.decode(errors="replace").strip()
        msg = " ".join(ln.removeprefix("FA_HOST: ") for ln in msg.splitlines()[-3:])
        raise _RunError(f"it crashed ({'signal ' + str(-r.returncode) if r.returncode < 0 else 'exit ' + str(r.returncode)}"
                        f"{': ' + msg if msg else ''}; an index out of range?)")
    return r.stdout


# ----------------------------------------------------------------------------- fragment layout
def c_coords(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of element c_i of a 16x8 C fragment held by ``lane`` (PTX ISA, mma.m16n8k16)."""
    g, t = lane >> 2, lane & 3
    return g + 8 * (i >> 1), 2 * t + (i & 1)


_ROWS = np.array([[c_coords(L, i)[0] for i in range(4)] for L in range(32)])   # [lane, i]
_COLS = np.array([[c_coords(L, i)[1] for i in range(4)] for L in range(32)])


def gather_c(frags: np.ndarray) -> np.ndarray:
    """[32 lanes][nblocks][4] C fragments -> the 16 x (8 nblocks) matrix."""
    nb = frags.shape[1]
    out = np.zeros((16, 8 * nb))
    for n in range(nb):
        out[_ROWS, 8 * n + _COLS] = frags[:, n, :]
    return out


def scatter_c(mat: np.ndarray) -> np.ndarray:
    """The 16 x (8 nblocks) matrix -> [32][nblocks][4] C fragments."""
    nb = mat.shape[1] // 8
    return np.stack([mat[_ROWS, 8 * n + _COLS] for n in range(nb)], axis=1)


def _h(x) -> np.ndarray:
    return np.asarray(x, np.float16)


# ----------------------------------------------------------------------------- results
@dataclass
class FunctionResult:
    name: str
    status: str              # "pass", "fail", "todo", "skipped"
    message: str = ""

    def line(self) -> str:
        tag = {"pass": "ok", "fail": "FAILED", "todo": "not implemented yet", "skipped": "not checked"}[self.status]
        return f"  {self.name:22s} {tag}" + (f": {self.message}" if self.message else "")


@dataclass
class HostCheckReport:
    results: list[FunctionResult] = field(default_factory=list)
    build: HostBuild | None = None

    @property
    def ok(self) -> bool:
        return all(r.status == "pass" for r in self.results)

    def failures(self) -> list[FunctionResult]:
        return [r for r in self.results if r.status in ("fail", "todo")]


# ----------------------------------------------------------------------------- online_softmax_update
NB, DB = 8, 16            # the driver's instance: BLOCK_N = 64 keys, D = 128
SCALE_LOG2 = (1 / math.sqrt(128)) * math.log2(math.e)


def _softmax_reference(s, m, l, o, c, *, scale=True, scale_p=True, quad=True, guard=True, alpha_l=True,
                       alpha_o=True, exp="exp2", l_quad=False, o_rows_swapped=False):
    """FA2's update on one warp's fragments, float64; keywords switch one classic mistake on."""
    s, m, l, o = (np.array(x, np.float64) for x in (s, m, l, o))
    P, M, L, O = s.copy(), m.copy(), l.copy(), o.copy()
    alphas = []
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(2):
            cols = [2 * r, 2 * r + 1]
            lane_max = s[:, :, cols].max(axis=(1, 2))
            tile = lane_max.reshape(8, 4).max(1).repeat(4) if quad else lane_max
            m_new = np.maximum(m[:, r], tile * (c if scale else 1.0))
            m_use = np.where(m_new == -np.inf, 0.0, m_new) if guard else m_new
            alpha = np.where(m_new == m[:, r], 1.0, np.exp2(m[:, r] - m_use)) if guard else np.exp2(m[:, r] - m_use)
            x = s[:, :, cols] * (c if scale and scale_p else 1.0) - m_use[:, None, None]
            P[:, :, cols] = np.exp2(x) if exp == "exp2" else np.exp(x)
            rowsum = P[:, :, cols].sum(axis=(1, 2))
            if l_quad:
                rowsum = rowsum.reshape(8, 4).sum(1).repeat(4)
            L[:, r] = (alpha if alpha_l else 1.0) * l[:, r] + rowsum
            M[:, r] = m_new
            alphas.append(alpha if alpha_o else np.ones(32))
        for r in range(2):
            a = alphas[1 - r] if o_rows_swapped else alphas[r]
            O[:, :, 2 * r:2 * r + 2] *= a[:, None, None]
    return P, M, L, O


def _softmax_cases(rng) -> list[tuple[str, dict]]:
    """Five calls, each isolating a step of the update: (name, inputs)."""
    def scores(scale=3.0):
        return (rng.standard_normal((32, NB, 4)) * scale).astype(np.float32)

    def fresh():
        return (np.full((32, 2), -np.inf, np.float32), np.zeros((32, 2), np.float32), np.zeros((32, DB, 4), np.float32))

    cases = []
    s = scores()
    s[:, 5:, :] = np.where(rng.random((32, 3, 4)) < 0.5, -np.inf, s[:, 5:, :])     # some masked keys
    cases.append(("the first key tile (m_i = -inf, l_i = 0, o = 0)", dict(s=s, m=fresh()[0], l=fresh()[1], o=fresh()[2])))
    # a growing max: the previous tiles' max was lower than this tile's
    s = scores()
    prev = (gather_c(s.astype(np.float64)).max(1) * SCALE_LOG2 - rng.uniform(0.5, 3.0, 16))
    m = np.stack([prev[_ROWS[:, 0]], prev[_ROWS[:, 2]]], 1).astype(np.float32)
    l = rng.uniform(0.5, 4.0, (32, 2)).astype(np.float32)
    o = rng.standard_normal((32, DB, 4)).astype(np.float32)
    cases.append(("a tile whose max is larger than the running max (alpha < 1)", dict(s=s, m=m, l=l, o=o)))
    # a steady max: this tile's scores are all below the running max
    s = scores(1.0)
    m = np.full((32, 2), 5.0 * SCALE_LOG2 + 2.0, np.float32)
    cases.append(("a tile below the running max (alpha = 1)", dict(s=s, m=m, l=l.copy(), o=o.copy())))
    # rows that have seen no key yet: rows g = 0..3 (element 0, 1: row g) all masked, with m = -inf
    s = scores()
    s[_ROWS[:, 0] < 4, :, 0:2] = -np.inf
    m0, l0, o0 = fresh()
    cases.append(("rows whose keys are all masked so far (m_i = -inf: exp2(-inf - (-inf)) is NaN)",
                  dict(s=s, m=m0, l=l0, o=o0)))
    # a fully masked tile after keys: rows g + 8 masked, running state finite
    s = scores()
    s[:, :, 2:4] = -np.inf
    m = rng.uniform(-1.0, 1.0, (32, 2)).astype(np.float32).reshape(8, 4, 2)[:, :1, :].repeat(4, 1).reshape(32, 2)
    cases.append(("a tile whose keys are all masked for rows g + 8, after earlier keys",
                  dict(s=s, m=m, l=l.copy(), o=o.copy())))
    return cases


def _close(got, ref, rtol=2e-5, atol=1e-6) -> np.ndarray:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    same_inf = np.isinf(ref) & (got == ref)
    with np.errstate(invalid="ignore"):
        return same_inf | (np.abs(got - ref) <= atol + rtol * np.abs(ref))


def _diagnose_softmax(case: str, inp: dict, got: tuple, c: float) -> str | None:
    """None when the outputs are right, else the likely cause."""
    ref = _softmax_reference(inp["s"], inp["m"], inp["l"], inp["o"], c)
    names = ("P (s on return)", "m_i", "l_i", "o")
    ok = [_close(g, r).all() for g, r in zip(got, ref)]
    if all(ok):
        return None
    where = f"[case: {case}] "
    unchanged = all(np.array_equal(g, inp[k], equal_nan=True) for g, k in zip(got, "smlo"))
    if unchanged:
        return where + "s, m_i, l_i and o come back unchanged: online_softmax_update does nothing yet"
    nan = [n for g, r, n in zip(got, ref, names) if (np.isnan(g) & ~np.isnan(r)).any()]
    if nan:
        empty = ref[1] == -np.inf                                  # [lane, r]: rows that have seen no key
        nan_rows = np.zeros((32, 2), bool)
        for r in range(2):
            nan_rows[:, r] |= np.isnan(got[0][:, :, 2 * r:2 * r + 2]).any(axis=(1, 2)) | np.isnan(got[2][:, r])
            nan_rows[:, r] |= np.isnan(got[3][:, :, 2 * r:2 * r + 2]).any(axis=(1, 2)) | np.isnan(got[1][:, r])
        if empty.any() and not (nan_rows & ~empty).any():
            return where + (f"NaN in {', '.join(nan)}: no -inf guard. A row whose keys were all masked so far has "
                            "m_i = -inf and exp2(s - m_i) = exp2(-inf - (-inf)) = NaN: offset the exponents by "
                            "fa::finite_max(m_new) and take alpha from fa::rescale_factor(m_old, m_new)")
        return where + f"NaN in {', '.join(nan)} where the reference is finite (a -inf - (-inf) or 0 * inf somewhere?)"
    M = np.asarray(got[1], np.float64)
    if not ok[1]:
        if _close(M, _softmax_reference(inp["s"], inp["m"], inp["l"], inp["o"], c, scale=False)[1]).all():
            return where + ("m_i is the raw scores' max: the scale is missing. m_i is in log2 units, "
                            "max(m_i, rowmax(s) * scale_log2), and P = exp2(s * scale_log2 - m_new)")
        quads = M.reshape(8, 4, 2)
        if (quads != quads[:, :1, :]).any() or _close(M, _softmax_reference(inp["s"], inp["m"], inp["l"], inp["o"], c,
                                                                             quad=False)[1]).all():
            return where + ("m_i differs among the four lanes of a quad: wrong quad reduction. A row's scores are "
                            "spread over lanes 4g..4g+3 (columns 2t, 2t+1 of each 8-key block): reduce the tile's row "
                            "max over them with quad_max (shuffles with xor 1 and 2) before comparing with m_i")
        if (M > ref[1] + 1e-6 * np.abs(ref[1])).any():
            return where + ("m_i is larger than the max of its own row: wrong quad reduction, or the rows mixed "
                            "(elements 0, 1 of s[n] are row g, elements 2, 3 row g + 8; reduce over xor 1 and 2 only)")
        return where + "m_i (the running max, in log2 units: max(m_old, rowmax(s) * scale_log2)) is wrong"
    if not ok[0]:
        if _softmax_matches(got, inp, c, scale_p=False, only=0):
            return where + "P = exp2(s - m_i): the scores are not multiplied by scale_log2 (the scale is missing)"
        if _softmax_matches(got, inp, c, exp="exp", only=0, m=M):
            return where + "P uses exp (base e): m_i is in log2 units, so P = exp2(s * scale_log2 - m_new)"
        return where + "P (what s holds on return) is wrong: P = exp2(s * scale_log2 - m_new), 0 for masked keys"
    if not ok[2]:
        if _softmax_matches(got, inp, c, alpha_l=False, only=2):
            o_too = _softmax_matches(got, inp, c, alpha_o=False, only=3) and not ok[3]
            return where + (("neither l_i nor o is" if o_too else "l_i is") + " rescaled by alpha: no alpha rescale "
                            "of " + ("l and O" if o_too else "l") + ". When the running max of a row grows, what was "
                            "accumulated so far shrinks by alpha = exp2(m_old - m_new): l_i = alpha * l_i + rowsum(P)"
                            + (", o *= alpha" if o_too else ""))
        if _softmax_matches(got, inp, c, l_quad=True, only=2):
            return where + ("l_i holds the quad's whole row sum (quad_sum): it must stay this lane's partial sum, "
                            "the harness adds the four partials at the end")
        return where + "l_i is wrong: l_i = alpha * l_i + (this lane's part of) rowsum(P)"
    if _softmax_matches(got, inp, c, alpha_o=False, only=3):
        return where + ("o is not rescaled: no alpha rescale of O_i. When the running max of a row grows, the "
                        "output accumulated so far must shrink by alpha = exp2(m_old - m_new): o[d][0..1] *= alpha "
                        "of row g, o[d][2..3] *= alpha of row g + 8")
    if _softmax_matches(got, inp, c, o_rows_swapped=True, only=3):
        return where + "o's rows are rescaled by the other row's alpha: o[d][0..1] are row g, o[d][2..3] row g + 8"
    return where + "o is wrong: o *= alpha (per row) and nothing else here (P V is pv_tile's)"


def _softmax_matches(got, inp, c, only: int, **mistake) -> bool:
    """Does the student's output number ``only`` (P, m, l, o) match that of ``mistake``?"""
    ref = _softmax_reference(inp["s"], inp["m"], inp["l"], inp["o"], c, **mistake)
    return bool(_close(np.asarray(got[only], np.float64), ref[only]).all())


def _check_softmax(binary: Path) -> FunctionResult:
    cases = _softmax_cases(np.random.default_rng(6))
    data = b"".join(b"".join(np.ascontiguousarray(inp[k], np.float32).tobytes() for k in "smlo")
                    + np.float32(SCALE_LOG2).tobytes() for _, inp in cases)
    out = _run(binary, ["softmax", len(cases)], data)
    sizes = [32 * NB * 4, 32 * 2, 32 * 2, 32 * DB * 4]
    arr = np.frombuffer(out, np.float32)
    if arr.size != sum(sizes) * len(cases):
        raise _RunError("it wrote no complete result")
    pos = 0
    for name, inp in cases:
        got = []
        for k, n in zip("smlo", sizes):
            got.append(arr[pos:pos + n].reshape(inp[k].shape))
            pos += n
        if (msg := _diagnose_softmax(name, inp, tuple(got), np.float32(SCALE_LOG2))) is not None:
            return FunctionResult("online_softmax_update", "fail", msg)
    return FunctionResult("online_softmax_update", "pass", f"{len(cases)} calls: the first tile, a growing max "
                          "(alpha), a steady max, rows with no key yet, a masked tile")


# ----------------------------------------------------------------------------- load_tile_async
LOAD_CASES = [   # (ROWS, D, rows_valid, row_stride, what)
    (64, 128, 64, 128, "a full K tile, contiguous rows"),
    (128, 128, 128, 3 * 128 + 64, "a Q tile of strided rows ([B, S, H, D] storage)"),
    (64, 128, 37, 2 * 128, "the last K tile: rows past rows_valid = 37"),
    (64, 64, 1000, 64, "D = 64, rows_valid past the tile"),
]
_NAN16 = np.uint16(0x7E00)      # shared memory no copy wrote
_PAD16 = np.uint16(0x7C01)      # global memory the tile may not read (a signalling NaN)


def _swz(D: int, r, c):
    return r * D + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7)


def _check_load(binary: Path) -> FunctionResult:
    rng = np.random.default_rng(7)
    synchronous = False
    for rows, D, rv, stride, what in LOAD_CASES:
        tile = _h(rng.standard_normal((rows, D)))
        g = np.full((rows, stride), _PAD16, np.uint16)
        nvalid = min(rv, rows)
        g[:nvalid, :D] = tile[:nvalid].view(np.uint16)
        out = _run(binary, ["load", rows, D, rv, stride], g.tobytes())
        guard = 2 * D
        smem = np.frombuffer(out[:2 * (rows * D + guard)], np.uint16)
        calls, bad_src, bad_dst, misaligned = np.frombuffer(out[2 * (rows * D + guard):], np.int64)
        want = np.zeros((rows, D), np.uint16)
        want[:nvalid] = tile[:nvalid].view(np.uint16)
        r, c = np.meshgrid(np.arange(rows), np.arange(D), indexing="ij")
        back = smem[_swz(D, r, c)]
        where = f"[case: {what}; ROWS = {rows}, D = {D}, rows_valid = {rv}, row_stride = {stride}] "
        if calls == 0 and (smem[:rows * D] == _NAN16).all():
            return FunctionResult("load_tile_async", "fail", where + "nothing reaches shared memory: load_tile_async "
                                  "does nothing yet (cp_async_16 is never called)")
        if bad_dst:
            return FunctionResult("load_tile_async", "fail", where + f"{bad_dst} cp_async_16 call(s) write past the "
                                  "tile's ROWS x D elements in shared memory")
        if (smem[rows * D:] != _NAN16).any():
            return FunctionResult("load_tile_async", "fail", where + "writes past the tile's ROWS x D elements")
        if bad_src:
            return FunctionResult("load_tile_async", "fail", where + (
                f"{bad_src} copies read global memory the tile may not read (rows r >= rows_valid, or past a row's D "
                "columns): call cp_async_16 with valid = false for rows r >= rows_valid (nothing is read, 16 zero "
                "bytes are written) and give row r's address as gmem + r * row_stride + c"))
        if misaligned:
            return FunctionResult("load_tile_async", "fail", where + "a 16-byte copy starts at no multiple of 8 "
                                  "elements: each thread copies whole chunks c = 0, 8, 16, ... of a row")
        if np.array_equal(back, want):
            synchronous = synchronous or calls == 0
            continue
        if np.array_equal(smem[:rows * D].reshape(rows, D), want):
            return FunctionResult("load_tile_async", "fail", where + "the tile is stored row-major (element (r, c) at "
                                  "r * D + c): no swizzle. Element (r, c) goes to smem[swizzle<D>(r, c)]")
        never = back == _NAN16
        if np.array_equal(back[:nvalid], want[:nvalid]) and nvalid < rows and (back[nvalid:] != 0).any():
            return FunctionResult("load_tile_async", "fail", where + "rows r >= rows_valid are not zero-filled: "
                                  "call cp_async_16 with valid = false for them (it writes 16 zero bytes)")
        if never.any():
            rr = sorted(set(np.nonzero(never)[0].tolist()))
            return FunctionResult("load_tile_async", "fail", where + (
                f"{int(never.sum()) // 8} chunks of 8 elements are never written (rows {_ranges(rr)}): the tile is "
                f"ROWS x D/8 chunks; thread tid copies chunks tid, tid + NTHREADS, ... "
                f"({rows * D // 8 // 256} each here)"))
        if stride != D:
            g2 = np.full((rows, D), 0, np.uint16)
            flat = g.reshape(-1)
            g2[:nvalid] = flat[:nvalid * D].reshape(nvalid, D)
            if np.array_equal(back[:nvalid], g2[:nvalid]):
                return FunctionResult("load_tile_async", "fail", where + "row r is read at gmem + r * D: use "
                                      "row_stride (rows of q, k, v are row_stride elements apart, not D)")
        bad = np.argwhere(back != want)[0]
        return FunctionResult("load_tile_async", "fail", where + (
            f"element ({bad[0]}, {bad[1]}) of the tile, read back at swizzle<D>(r, c), is wrong "
            f"({int((back != want).sum())} elements wrong): each 16-byte chunk (r, c) of the tile goes to "
            "smem + swizzle<D>(r, c), from gmem + r * row_stride + c"))
    how = ("; but no cp_async_16 call: the copy goes through registers and the pipeline overlaps nothing"
           if synchronous else ", 16-byte cp.async copies")
    return FunctionResult("load_tile_async", "pass", f"{len(LOAD_CASES)} tiles: swizzled, strided rows, zero-filled "
                          "past rows_valid" + how)


def _ranges(xs: list[int]) -> str:
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out[:6]) + (" ..." if len(out) > 6 else "")


# ----------------------------------------------------------------------------- qk_tile, pv_tile
def _unswizzled_view(mat: np.ndarray) -> np.ndarray:
    """What reading a swizzled [R][D] tile at r * D + c (without the swizzle) gives."""
    R, D = mat.shape
    smem = np.zeros(R * D, mat.dtype)
    r, c = np.meshgrid(np.arange(R), np.arange(D), indexing="ij")
    smem[_swz(D, r, c)] = mat
    return smem.reshape(R, D)


def _blocks_wrong(got: np.ndarray, ref: np.ndarray, tol: float) -> list[int]:
    return [n for n in range(got.shape[1] // 8) if np.abs(got[:, 8 * n:8 * n + 8] - ref[:, 8 * n:8 * n + 8]).max() > tol]


def _check_qk(binary: Path) -> FunctionResult:
    rng = np.random.default_rng(8)
    for D in (64, 128):
        Q, K = _h(rng.standard_normal((16, D))), _h(rng.standard_normal((64, D)))
        out = _run(binary, ["qk", D], Q.view(np.uint16).tobytes() + K.view(np.uint16).tobytes())
        S = gather_c(np.frombuffer(out, np.float32).reshape(32, 8, 4).astype(np.float64))
        ref = Q.astype(np.float64) @ K.astype(np.float64).T
        tol = 1e-4 * np.abs(ref).max() + 1e-4
        where = f"[case: 16 query rows x 64 keys, D = {D}] "
        if np.abs(S - ref).max() <= tol:
            continue
        if not np.abs(S).any():
            return FunctionResult("qk_tile", "fail", where + "S is all zero: qk_tile computes nothing yet")
        if np.abs(S - Q.astype(np.float64) @ _unswizzled_view(K).astype(np.float64).T).max() <= tol:
            return FunctionResult("qk_tile", "fail", where + "K is read from shared memory without the swizzle: "
                                  "row r, column c of the tile is at sK + swizzle<D>(r, c)")
        part = [kk for kk in range(1, D // 16) if np.abs(S - Q[:, :16 * kk].astype(np.float64)
                                                           @ K[:, :16 * kk].astype(np.float64).T).max() <= tol]
        if part:
            return FunctionResult("qk_tile", "fail", where + f"S sums over only the first {16 * part[0]} of D = {D} "
                                  "columns: loop kk over D / 16 (one ldmatrix_x4 per 16 keys and 16 columns)")
        wrong = _blocks_wrong(S, ref, tol)
        moved = {n: m for n in wrong for m in range(8) if np.abs(S[:, 8 * n:8 * n + 8] - ref[:, 8 * m:8 * m + 8]).max() <= tol}
        if moved:
            n, m = next(iter(moved.items()))
            return FunctionResult("qk_tile", "fail", where + f"s[{n}] holds keys {8 * m}..{8 * m + 7} instead of "
                                  f"{8 * n}..{8 * n + 7}: s[n] is the C fragment of keys 8n..8n+7; with one ldmatrix_x4 "
                                  "per 16 keys, b[0], b[1] feed keys 0-7 and b[2], b[3] keys 8-15")
        return FunctionResult("qk_tile", "fail", where + (
            f"S = Q K^T is wrong in key blocks {wrong} (s[n] = keys 8n..8n+7). Check which lanes address which 8x8 "
            "matrix (lanes 8i..8i+7 give the rows of matrix i: keys np*16 + (lane & 7) + (lane >> 4) * 8, columns "
            "kk*16 + ((lane >> 3) & 1) * 8) and which registers feed each mma_16816 (no .trans for K)"))
    return FunctionResult("qk_tile", "pass", "S = Q K^T for 16 rows x 64 keys, D = 64 and 128")


def _check_pv(binary: Path) -> FunctionResult:
    rng = np.random.default_rng(9)
    for D in (64, 128):
        P = rng.uniform(0, 1, (16, 64))
        V = _h(rng.standard_normal((64, D)))
        O0 = rng.standard_normal((16, D))
        p, o0 = scatter_c(P).astype(np.float32), scatter_c(O0).astype(np.float32)
        out = _run(binary, ["pv", D], p.tobytes() + V.view(np.uint16).tobytes() + o0.tobytes())
        O = gather_c(np.frombuffer(out, np.float32).reshape(32, D // 8, 4).astype(np.float64))
        Ph = _h(P).astype(np.float64)
        Vd = V.astype(np.float64)
        ref = O0 + Ph @ Vd
        tol = 1e-4 * np.abs(ref).max() + 1e-4
        where = f"[case: 16 rows x 64 keys, D = {D}] "
        if np.abs(O - ref).max() <= tol:
            continue
        if np.abs(O - O0).max() <= 1e-6:
            return FunctionResult("pv_tile", "fail", where + "o comes back unchanged: pv_tile computes nothing yet")
        if np.abs(O - Ph @ Vd).max() <= tol:
            return FunctionResult("pv_tile", "fail", where + "o is overwritten with P V: it must accumulate, "
                                  "O_i += P V_j (mma_16816 adds into its C fragment; do not zero o)")
        if np.abs(O - O0 - Ph @ _unswizzled_view(V).astype(np.float64)).max() <= tol:
            return FunctionResult("pv_tile", "fail", where + "V is read from shared memory without the swizzle: "
                                  "row r, column c of the tile is at sV + swizzle<D>(r, c)")
        wrong = _blocks_wrong(O, ref, tol)
        return FunctionResult("pv_tile", "fail", where + (
            f"O += P V is wrong in column blocks {wrong} (o[d] = columns 8d..8d+7). The A fragment of P for "
            "keys 16kk..16kk+15 is pack2 of p[2kk][0,1], p[2kk][2,3], p[2kk+1][0,1], p[2kk+1][2,3]; V is [key][d], "
            "so ldmatrix_x4_trans, rows kk*16 + (lane & 15), columns dp*16 + (lane >> 4) * 8; b[0], b[1] feed "
            "columns 0-7 of the 16, b[2], b[3] columns 8-15"))
    return FunctionResult("pv_tile", "pass", "O += P V for 16 rows x 64 keys, D = 64 and 128")


# ============================================================================= step 07 (Hopper)
# The kernel's constants (hopper_common.cuh): BLOCK_M = BLOCK_N = 128 rows, STAGES = 2, panels of 64 columns.
H_ROWS, H_STAGES, H_PANEL = 128, 2, 64
WAIT, EXPECT, TMA, ARRIVE, VERIFY = 1, 2, 3, 4, 5          # the driver's operation and event kinds
BARS = ("q_full", "q_empty", "k_full[0]", "k_full[1]", "k_empty[0]", "k_empty[1]", "v_full[0]", "v_full[1]",
        "v_empty[0]", "v_empty[1]", "tile_full[0]", "tile_full[1]", "tile_empty[0]", "tile_empty[1]")
_BAR_BASE = {"q_full": 0, "q_empty": 1, "k_full": 2, "k_empty": 4, "v_full": 6, "v_empty": 8}
_EMPTY_BARS = {1, 4, 5, 8, 9, 12, 13}                      # their phases count 8 arrivals (one per consumer warp)
REGIONS = ("Q", "K slot 0", "V slot 0", "K slot 1", "V slot 1")   # the driver's order of the slots
MAPS = ("Q", "K", "V")
LOG2E, LN2 = math.log2(math.e), math.log(2.0)


def _bar(kind: str, s: int = 0) -> int:
    return _BAR_BASE[kind] + (s if kind[0] in "kv" else 0)


@dataclass(frozen=True)
class Problem:
    """One attention problem the emulated CTA runs (gridDim 1: the persistent CTA takes every tile)."""
    name: str
    D: int
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Skv: int
    causal: bool
    bf16: bool = False
    seed: int = 0
    amp: float = 1.0          # the scale of q and k (large logits move the running max)

    @property
    def scale(self) -> float:
        return 1 / math.sqrt(self.D)

    def layout(self) -> dict[str, int]:
        q = H_ROWS * self.D * 2
        return {"Q": 0, "Q_bytes": q, "K": q, "KV_bytes": q, "V": q + H_STAGES * q}

    def text(self) -> str:
        return (f"{'bf16' if self.bf16 else 'fp16'}, D = {self.D}, B = {self.B}, Hq = {self.Hq}, Hkv = {self.Hkv}, "
                f"Sq = {self.Sq}, Skv = {self.Skv}, {'causal' if self.causal else 'not causal'}")


PRODUCER_PROBLEMS = (
    Problem("gqa_causal", D=128, B=1, Hq=4, Hkv=2, Sq=200, Skv=328, causal=True, seed=71),
    Problem("empty_tiles", D=64, B=2, Hq=2, Hkv=1, Sq=300, Skv=100, causal=True, seed=72),
)
CONSUMER_PROBLEMS = (
    Problem("diagonal", D=128, B=1, Hq=2, Hkv=1, Sq=200, Skv=360, causal=True, seed=73, amp=1.5),
    Problem("empty_rows", D=64, B=2, Hq=2, Hkv=1, Sq=300, Skv=100, causal=True, seed=74),
    Problem("five_blocks_bf16", D=128, B=1, Hq=1, Hkv=1, Sq=100, Skv=520, causal=False, bf16=True, seed=75, amp=2.0),
)


def _num_kv_blocks(P: Problem, m_block: int) -> int:
    n = -(-P.Skv // H_ROWS)
    if P.causal:
        last_key = min(m_block * H_ROWS + H_ROWS, P.Sq) - 1 + P.Skv - P.Sq
        n = 0 if last_key < 0 else min(n, last_key // H_ROWS + 1)
    return n


def _tiles(P: Problem) -> list[tuple[int, int, int, int, int]]:
    """(tile number, m_block, h, b, nb) in the scheduler's order (hopper_common.cuh's TileScheduler)."""
    m_blocks = -(-P.Sq // H_ROWS)
    out = []
    for t in range(m_blocks * P.Hq * P.B):
        bh = t // m_blocks
        mb = m_blocks - 1 - t % m_blocks
        out.append((t, mb, bh % P.Hq, bh // P.Hq, _num_kv_blocks(P, mb)))
    return out


def _schedule(P: Problem, *, gqa="div", left_to_right=False, all_blocks=False, skip_empty=True, block_coords=False,
              reset_it=False, first_panel_only=False, panel_coords=False):
    """What the producer does, tile by tile (the one place this check knows it): operations (tile, kind,
    bar, arg, map, dst, c0, c1, c2, c3) for the oracle producer and to compare a producer with; the
    consumers' side of the ring for the oracle consumers (waits, checks of what landed, releases, in the
    solution's order); and, per TMA, what it loads. Keywords switch one classic mistake on."""
    lay = P.layout()
    panels = 1 if first_panel_only else P.D // H_PANEL
    group = P.Hq // P.Hkv
    pops, cops, what = [], [], []
    it = q_round = 0
    for t, mb, h, b, nb in _tiles(P):
        if all_blocks:
            nb = -(-P.Skv // H_ROWS)
        if nb == 0 and skip_empty:
            continue
        if reset_it:
            it = 0
        hk = {"div": h // group, "same": h, "mod": h % P.Hkv}[gqa]

        def row(block):
            return block if block_coords else block * H_ROWS

        def col(c):
            return c if panel_coords else c * H_PANEL

        tile = dict(t=t, m_block=mb, h=h, b=b, nb=nb)
        if q_round > 0:
            pops.append((t, WAIT, _bar("q_empty"), (q_round - 1) & 1, 0, 0, 0, 0, 0, 0))
        pops.append((t, EXPECT, _bar("q_full"), lay["Q_bytes"], 0, 0, 0, 0, 0, 0))
        for c in range(panels):
            pops.append((t, TMA, _bar("q_full"), 0, 0, lay["Q"] + c * H_ROWS * 128, col(c), row(mb), h, b))
            what.append(dict(tile, map="Q", panel=c, q_round=q_round))
        blocks = list(range(nb)) if left_to_right else list(range(nb - 1, -1, -1))
        ring = []
        for j in blocks:
            s, ph = it % H_STAGES, (it // H_STAGES) & 1
            for kind, m in (("k", 1), ("v", 2)):
                pops.append((t, WAIT, _bar(kind + "_empty", s), ph ^ 1, 0, 0, 0, 0, 0, 0))
                pops.append((t, EXPECT, _bar(kind + "_full", s), lay["KV_bytes"], 0, 0, 0, 0, 0, 0))
                for c in range(panels):
                    pops.append((t, TMA, _bar(kind + "_full", s), 0, m, lay[kind.upper()] + s * lay["KV_bytes"]
                                 + c * H_ROWS * 128, col(c), row(j), hk, b))
                    what.append(dict(tile, map=kind.upper(), panel=c, j=j, it=it, slot=s, hk=hk))
            ring.append((it, j))
            it += 1
        if nb > 0:
            cops.append((t, WAIT, _bar("q_full"), q_round & 1, 0, 0, 0, 0, 0, 0))
            cops.append((t, VERIFY, 0, 0, 0, lay["Q"], 0, mb * H_ROWS, h, b))

            def take(i, kind):
                pos, j = ring[i]
                s = pos % H_STAGES
                cops.append((t, WAIT, _bar(kind + "_full", s), (pos // H_STAGES) & 1, 0, 0, 0, 0, 0, 0))
                cops.append((t, VERIFY, 0, 0, 1 if kind == "k" else 2, lay[kind.upper()] + s * lay["KV_bytes"], 0,
                             j * H_ROWS, hk, b))

            def give(i, kind):
                cops.append((t, ARRIVE, _bar(kind + "_empty", ring[i][0] % H_STAGES), 0, 0, 0, 0, 0, 0, 0))

            take(0, "k")
            give(0, "k")
            for i in range(1, len(ring)):
                take(i, "k")
                take(i - 1, "v")
                give(i, "k")
                give(i - 1, "v")
            cops.append((t, ARRIVE, _bar("q_empty"), 0, 0, 0, 0, 0, 0, 0))
            take(len(ring) - 1, "v")
            give(len(ring) - 1, "v")
        q_round += 1
    return pops, cops, what


# ----------------------------------------------------------------------------- inputs, runs
def _to_bits(x, bf16: bool) -> np.ndarray:
    if not bf16:
        return np.asarray(x, np.float16).view(np.uint16)
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def _from_bits(bits, bf16: bool) -> np.ndarray:
    bits = np.asarray(bits, np.uint16)
    if not bf16:
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _round(x, bf16: bool) -> np.ndarray:
    return _from_bits(_to_bits(x, bf16), bf16)


def _inputs(P: Problem):
    """q, k, v of a problem as ([B, H, S, D] bit patterns, the same as float64)."""
    rng = np.random.default_rng(P.seed)
    out = []
    for shape, amp in (((P.B, P.Hq, P.Sq, P.D), P.amp), ((P.B, P.Hkv, P.Skv, P.D), P.amp), ((P.B, P.Hkv, P.Skv, P.D), 1.0)):
        bits = _to_bits(rng.standard_normal(shape) * amp, P.bf16)
        out.append((bits, _from_bits(bits, P.bf16)))
    return out


@dataclass
class _KernelRun:
    ok: bool
    message: str                  # the emulation's failure (empty when ok)
    trace: np.ndarray             # [n, 11]: kind, bar, arg, map, dst, c0, c1, c2, c3, phase, returned
    stats: dict
    o: np.ndarray | None = None
    lse: np.ndarray | None = None


def _run_full(binary: Path, args: list, data: bytes, timeout: float) -> tuple[int | None, bytes, str]:
    try:
        r = subprocess.run([str(binary), *map(str, args)], input=data, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return None, e.stdout or b"", f"it did not finish within {timeout:.0f} s"
    err = r.stderr.decode(errors="replace")
    i = err.find("FA_HOST: ")
    msg = err[i + len("FA_HOST: "):].strip() if i >= 0 else err.strip()[-600:]
    if r.returncode != 0 and not msg:
        msg = f"it crashed ({'signal ' + str(-r.returncode) if r.returncode < 0 else 'exit ' + str(r.returncode)})"
    return r.returncode, r.stdout, msg


def _run_kernel(binary: Path, P: Problem, *, oracle_producer: bool, oracle_consumer: bool) -> _KernelRun:
    (qb, _), (kb, _), (vb, _) = _inputs(P)
    pops, cops, _ = _schedule(P)
    pops = pops if oracle_producer else []
    cops = cops if oracle_consumer else []
    data = (np.array([len(pops), len(cops)], np.int64).tobytes() + np.float32(P.scale).tobytes() + qb.tobytes()
            + kb.tobytes() + vb.tobytes() + np.array(pops, np.int64).reshape(-1, 10).tobytes()
            + np.array(cops, np.int64).reshape(-1, 10).tobytes())
    args = ["kernel", int(P.bf16), P.D, P.B, P.Hq, P.Hkv, P.Sq, P.Skv, int(P.causal), int(oracle_producer),
            int(oracle_consumer)]
    rc, out, msg = _run_full(binary, args, data, timeout=40)
    trace, stats = np.zeros((0, 11), np.int64), {}
    if len(out) >= 32:
        n, gemms, waits, arrives = np.frombuffer(out[:32], np.int64)
        stats = dict(gemms=int(gemms), waits=int(waits), arrives=int(arrives))
        trace = np.frombuffer(out[32:32 + 88 * int(n)], np.int64).reshape(-1, 11)
        out = out[32 + 88 * int(n):]
    if rc != 0:
        return _KernelRun(False, msg or "it ended without a result", trace, stats)
    n_o = P.B * P.Hq * P.Sq * P.D
    o = _from_bits(np.frombuffer(out[:2 * n_o], np.uint16), P.bf16).reshape(P.B, P.Hq, P.Sq, P.D)
    lse = np.frombuffer(out[2 * n_o:2 * n_o + 4 * P.B * P.Hq * P.Sq], np.float32).astype(np.float64)
    return _KernelRun(True, "", trace, stats, o, lse.reshape(P.B, P.Hq, P.Sq))


def _who(tid: int) -> str:
    return "the producer" if tid < 128 else f"consumer warpgroup {tid // 128 - 1}"


def _deadlock(msg: str) -> dict | None:
    """The emulation's deadlock report, parsed: waiters [(who, text, detail)], barriers, holds."""
    if not msg.startswith("DEADLOCK"):
        return None
    groups, bars, holds = {}, {}, {}
    for ln in msg.splitlines()[1:]:
        f = ln.split()
        if f[0] == "waiter" and f[2] == "mbar":
            tid, (bid, parity, done, pending, tx, uses) = int(f[1]), map(int, f[3:9])
            key = (_who(tid), "mbar", bid, parity)
            groups.setdefault(key, dict(n=0, done=done, pending=pending, uses=uses))["n"] += 1
        elif f[0] == "waiter" and f[2] == "named":
            tid, (bid, count, arrived) = int(f[1]), map(int, f[3:6])
            groups.setdefault((_who(tid), "named", bid, count), dict(n=0, arrived=arrived))["n"] += 1
        elif f[0] == "bar":
            bars[int(f[1])] = tuple(map(int, f[2:5]))
        elif f[0] == "hold":
            holds[(int(f[1]), int(f[2]))] = tuple(map(int, f[3:5]))
    lines = []
    for (who, kind, bid, arg), g in sorted(groups.items(), key=lambda kv: (kv[0][0] != "the producer", kv[0])):
        many = f" ({g['n']} threads)" if g["n"] > 1 else ""
        if kind == "named":
            lines.append(f"{who}{many} waits at named barrier {bid} (a GEMM turn: {g['arrived']} of {arg} threads "
                         "have arrived)")
            continue
        name = BARS[bid] if 0 <= bid < len(BARS) else f"mbarrier {bid}"
        state = f"{name} has completed {g['done']} phase{'s' if g['done'] != 1 else ''}"
        if bid in _EMPTY_BARS:
            state += f"; {8 - g['pending']} of 8 consumer warps have arrived in the current one"
        lines.append(f"{who}{many} waits on {name} with parity {arg} ({state})")
    return dict(lines=lines, groups=groups, bars=bars, holds=holds)


# ----------------------------------------------------------------------------- producer
def _events(trace: np.ndarray) -> list[dict]:
    """The producer's calls, tile barriers (the given scheduler's) left out."""
    keys = ("kind", "bar", "arg", "map", "dst", "c0", "c1", "c2", "c3", "phase", "ret")
    return [dict(zip(keys, map(int, r))) for r in trace if not (10 <= r[1] <= 13 and r[0] != TMA)]


def _tma_key(e) -> tuple:
    return (e["map"], e["dst"], e["bar"], e["c0"], e["c1"], e["c2"], e["c3"])


def _per_map(tmas: list[tuple]) -> list[list[tuple]]:
    return [[x for x in tmas if x[0] == m] for m in range(3)]


_PRODUCER_MISTAKES = (   # (keywords of _schedule, the cause)
    (dict(gqa="same"), "GQA: K and V are loaded from KV head h (the query head) instead of h / (Hq / Hkv)"),
    (dict(gqa="mod"), "GQA: K and V are loaded from KV head h % Hkv instead of h / (Hq / Hkv) (a group of Hq / Hkv "
                      "consecutive query heads shares one KV head)"),
    (dict(left_to_right=True), "key blocks go left to right: the consumers take them right to left, j = nb-1 down "
                               "to 0 (the masked blocks first)"),
    (dict(skip_empty=False), "Q is loaded for tiles with no key block (nb = 0): the consumers skip those tiles and "
                             "never release their Q; skip them (continue) as the consumers do"),
    (dict(all_blocks=True), "every key block of Skv is loaded, also those past the causal diagonal: load "
                            "nb = num_kv_blocks(p, tile.m_block) blocks"),
    (dict(block_coords=True), "the row coordinate is a block number: TMA coordinates are elements, so row "
                              "m_block * BLOCK_M for Q and j * BLOCK_N for K_j, V_j"),
    (dict(reset_it=True), "the ring position `it` restarts at 0 for every tile: it counts every key block the CTA "
                          "has loaded (the consumers continue it from tile to tile)"),
    (dict(first_panel_only=True), "only the first 64 columns are loaded: one tma_load_4d per 64-column panel "
                                  "(L::kPanels = D / 64), panel c at column c * 64"),
    (dict(panel_coords=True), "the column coordinate of panel c is c: it is an element index, c * PANEL"),
)


def _describe_tma(w: dict, key: tuple | None) -> str:
    where = f"tile (m_block {w['m_block']}, head {w['h']}, batch {w['b']})"
    if w["map"] == "Q":
        want = f"Q_i, {where}, panel {w['panel']}"
    else:
        want = (f"{w['map']}_j of {where}: key block j = {w['j']}, ring position it = {w['it']} (slot {w['slot']}), "
                f"KV head {w['hk']}, panel {w['panel']}")
    if key is None:
        return f"{want}: never loaded"
    m, dst, bar, c0, c1, c2, c3 = key
    return (f"{want}; your TMA: tensor map {MAPS[m] if 0 <= m < 3 else '?'}, destination smem + {dst}, barrier "
            f"{BARS[bar] if 0 <= bar < len(BARS) else '(no mbarrier)'}, coordinates ({c0}, {c1}, {c2}, {c3})")


def _expected_tma(P: Problem) -> tuple[list[tuple], list[dict]]:
    pops, _, what = _schedule(P)
    return [(o[4], o[5], o[2], o[6], o[7], o[8], o[9]) for o in pops if o[1] == TMA], what


def _diagnose_tmas(P: Problem, events: list[dict], complete: bool) -> str | None:
    """Compare the producer's TMA calls (per tensor map, in order) with the schedule and its mistakes."""
    got = _per_map([_tma_key(e) for e in events if e["kind"] == TMA])
    want_all, what = _expected_tma(P)
    want = _per_map(want_all)

    def agrees(w, g):
        return all((g[m] == w[m]) if complete else (g[m] == w[m][:len(g[m])]) for m in range(3))

    if agrees(want, got):
        return None
    for mistake, cause in _PRODUCER_MISTAKES:
        pops, _, _ = _schedule(P, **mistake)
        alt = _per_map([(o[4], o[5], o[2], o[6], o[7], o[8], o[9]) for o in pops if o[1] == TMA])
        if alt != want and any(got) and agrees(alt, got):
            return cause
    whats = [[w for w in what if w["map"] == name] for name in MAPS]
    for m in range(3):
        for i, w in enumerate(whats[m]):
            g = got[m][i] if i < len(got[m]) else None
            if g is None and not complete:
                break
            if g != want[m][i]:
                return "the TMA loads differ from the schedule at " + _describe_tma(w, g) + _tma_hint(P, w, g, want[m][i])
        if len(got[m]) > len(want[m]):
            extra = got[m][len(want[m])]
            return (f"{len(got[m])} TMA loads of {MAPS[m]}, {len(want[m])} expected; the first extra one: destination "
                    f"smem + {extra[1]}, coordinates {extra[3:]}")
    return None


def _tma_hint(P: Problem, w: dict, g: tuple | None, want: tuple) -> str:
    if g is None:
        return ""
    m, dst, bar, c0, c1, c2, c3 = g
    lay = P.layout()
    if m != want[0]:
        return f". It loads from tm_{MAPS[m].lower() if 0 <= m < 3 else '?'}: {w['map']} comes from tm_{w['map'].lower()}"
    if bar != want[2]:
        name = BARS[bar] if 0 <= bar < len(BARS) else bar
        return f". Its barrier is {name}: the loads into a slot complete on that slot's full barrier, {BARS[want[2]]}"
    if dst != want[1]:
        if w["map"] == "Q":
            return (f". Q_i's panel c goes to smem + L::kQ + c * BLOCK_M * 128 (= {want[1]})")
        return (f". {w['map']}_j goes to slot(it) = {w['slot']}: smem + L::k{w['map']} + slot * L::kKVBytes + "
                f"c * BLOCK_N * 128 (= {want[1]})")
    if (c0, c1, c2, c3) != want[3:]:
        return f". The coordinates are (column, row, head, batch) = {want[3:]}"
    return ""


def _diagnose_bytes(P: Problem, events: list[dict], complete: bool) -> str | None:
    """One mbar_expect_tx per fill of a slot, announcing the fill's bytes (the loads already match)."""
    lay = P.layout()
    for bid in (0, 2, 3, 6, 7):
        want = lay["Q_bytes"] if bid == 0 else lay["KV_bytes"]
        name = "L::kQBytes" if bid == 0 else "L::kKVBytes"
        fills = sum(1 for e in events if e["kind"] == TMA and e["bar"] == bid) // (P.D // H_PANEL)
        expects = [e["arg"] for e in events if e["kind"] == EXPECT and e["bar"] == bid]
        if not fills:
            continue
        if not expects:
            return (f"no mbar_expect_tx on {BARS[bid]}: the producer's one arrival on a full barrier is the "
                    f"expect_tx announcing the fill's bytes ({name} = {want}); without it the consumers wait forever")
        if len(expects) > fills + (0 if complete else 1):
            return (f"{len(expects)} mbar_expect_tx on {BARS[bid]} for {fills} fills: a full barrier counts one "
                    f"arrival per phase, so announce a whole fill at once ({name} = {want} bytes), not panel by panel")
        if any(x != want for x in expects):
            x = next(x for x in expects if x != want)
            return (f"mbar_expect_tx announces {x} bytes on {BARS[bid]}; a fill loads {want} ({name}: "
                    f"{'BLOCK_M' if bid == 0 else 'BLOCK_N'} * D * 2 bytes, all D / 64 panels). The phase completes "
                    "when exactly the announced bytes have landed")
        if len(expects) < fills:
            return (f"{fills} fills of {BARS[bid]}'s slot but {len(expects)} mbar_expect_tx: announce the bytes of "
                    "every fill")
    return None


def _diagnose_waits(events: list[dict]) -> str | None:
    """Before it reloads a slot, the producer waits on the slot's empty barrier with parity phase(it) ^ 1."""
    for full, empty, name in [(0, 1, "Q")] + [(_bar(k + "_full", s), _bar(k + "_empty", s), f"{k.upper()} slot {s}")
                                            for s in range(H_STAGES) for k in "kv"]:
        starts = []                                        # event index of each fill's first load
        seen = set()
        for i, e in enumerate(events):
            if e["kind"] == TMA and e["bar"] == full and e["phase"] not in seen:
                seen.add(e["phase"])
                starts.append(i)
        waits = [(i, e) for i, e in enumerate(events) if e["kind"] == WAIT and e["bar"] == empty]
        for n, start in enumerate(starts + [len(events)]):   # the last: a fill the producer is waiting to load
            lo = starts[n - 1] if n else -1
            mine = [e["arg"] for i, e in waits if lo < i < start]
            if n == len(starts) and not mine:
                break
            what = ("Q (a new tile's Q_i)" if full == 0 else f"{name}") + f" for the {_ordinal(n + 1)} time"
            if n == 0:
                if 0 in mine:
                    return (f"the producer waits on {BARS[empty]} with parity 0 before it first loads {name}: a fresh "
                            "barrier is in phase 0, which completes only when the consumers release the slot, so "
                            "this waits forever. Wait with parity phase(it) ^ 1 (1 on the first pass over the ring: "
                            "a fresh barrier counts as released)" if full else
                            "the producer waits on q_empty before the first tile's Q: nothing has released it yet, "
                            "so this waits forever; wait from the second tile on, with parity (round - 1) & 1")
                continue
            need = (n - 1) & 1
            if need in mine:
                continue
            after = [e["arg"] for i, e in waits if start < i < (starts[n + 1] if n + 1 < len(starts) else len(events))]
            if n == len(starts):
                after = []
            if need in after:
                return (f"the producer loads {what} before waiting on {BARS[empty]}: wait for the slot to be released, "
                        "then announce and load")
            if mine:
                return (f"the producer reloads {what} after waiting on {BARS[empty]} with parity {mine[-1]}; that "
                        f"fill needs parity {need} (" + ("phase(it) ^ 1, `it` the ring position" if full else
                                                         "(round - 1) & 1, round = the tiles loaded so far")
                        + "): with the wrong parity the wait returns while the consumers still read the slot, or "
                          "never")
            return (f"the producer reloads {what} without waiting on {BARS[empty]}: the consumers may still be "
                    "reading it. Wait for it to be released first (parity " + ("phase(it) ^ 1)" if full else
                                                                             "(round - 1) & 1)"))
    return None


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


_VERIFY = re.compile(r"VERIFY (Q|[KV] slot \d) (-?\d+) (-?\d+) (-?\d+) (-?\d+) (\d+) found (.*)")


def _verify_text(msg: str) -> str:
    """The oracle consumers' finding (what a slot holds when they read it) in words."""
    m = _VERIFY.match(msg)
    if m is None:
        return msg
    region, (mi, row, h, b, panel), found = m[1], map(int, m.groups()[1:6]), m[7].split()
    want = f"{MAPS[mi]} rows {row}-{row + H_ROWS - 1} of head {h}, batch {b}, columns {64 * panel}-{64 * panel + 63}"
    if found[0] == "unwritten":
        have = "nothing: no TMA wrote it"
    elif found[0] == "none":
        have = "data that is no box of Q, K or V"
    else:
        fm, c0, r0, fh, fb = map(int, found)
        have = f"{MAPS[fm]} rows {r0}-{r0 + H_ROWS - 1} of head {fh}, batch {fb}, columns {c0}-{c0 + 63}"
    return f"when the consumers read {region}, it holds {have} instead of {want}"


def _check_producer(binary: Path) -> FunctionResult:
    for P in PRODUCER_PROBLEMS:
        run = _run_kernel(binary, P, oracle_producer=False, oracle_consumer=True)
        events = _events(run.trace)
        where = f"[case: {P.text()}] "
        if not run.stats:
            return FunctionResult("producer", "fail", where + f"the emulated CTA stopped: {run.message}")
        if not any(e["kind"] in (TMA, EXPECT) for e in events):
            return FunctionResult("producer", "fail", where + "the producer loads nothing (no TMA, no expect_tx): "
                                  "the consumers wait for Q_i forever")
        for diagnose in (lambda: _diagnose_tmas(P, events, run.ok), lambda: _diagnose_bytes(P, events, run.ok),
                         lambda: _diagnose_waits(events)):
            if (msg := diagnose()) is not None:
                return FunctionResult("producer", "fail", where + msg)
        if not run.ok:
            dl = _deadlock(run.message)
            if dl is not None:
                return FunctionResult("producer", "fail", where + "deadlock with the (correct) consumers: "
                                      + "; ".join(dl["lines"]))
            if run.message.startswith("VERIFY"):
                return FunctionResult("producer", "fail", where + _verify_text(run.message))
            return FunctionResult("producer", "fail", where + run.message)
    return FunctionResult("producer", "pass", f"{len(PRODUCER_PROBLEMS)} problems against consumers that check "
                          "every slot: tiles, key blocks right to left, GQA, coordinates, bytes, waits and parities")


# ----------------------------------------------------------------------------- gemm_qk, gemm_pv
def _wgmma_coords(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) [128 threads, n/2] of the accumulator of an m64nNk16 WGMMA: step 06's 16x8 C fragment
    (``c_coords``) stacked n/8 times along N, warp w of the warpgroup holding rows 16w..16w+15."""
    t, i = np.arange(128)[:, None], np.arange(n // 2)[None, :]
    w, lane = t // 32, t % 32
    return 16 * w + _ROWS[lane, i % 4], 8 * (i // 4) + _COLS[lane, i % 4]


def _desc(d: int) -> dict:
    d &= (1 << 64) - 1
    return dict(start=(d & 0x3FFF) << 4, lead=((d >> 16) & 0x3FFF) << 4, stride=((d >> 32) & 0x3FFF) << 4,
                swizzle=d >> 62)


def _gemm_log(buf: bytes, nhead: int) -> tuple[list[int], list[dict], bytes]:
    head = [int(x) for x in np.frombuffer(buf[:8 * nhead], np.int64)]
    n = int(np.frombuffer(buf[8 * nhead:8 * nhead + 8], np.int64)[0])
    rows = np.frombuffer(buf[8 * nhead + 8:8 * nhead + 8 + 56 * n], np.int64).reshape(-1, 7)
    ops = [dict(a=_desc(int(r[0])), b=_desc(int(r[1])), acc=bool(r[2]), rs=bool(r[3]), bf16=bool(r[4]), n=int(r[5]),
                kk=int(r[6])) for r in rows]
    return head, ops, buf[8 * nhead + 8 + 56 * n:]


GEMM_CASES = ((False, 128, 1), (False, 64, 0), (True, 128, 0))   # (bf16, D, the warpgroup of the rows)


def _offset_text(off: int, panel_bytes: int) -> str:
    panel, within = divmod(off, panel_bytes)
    return f"+ {off} bytes (panel {panel} + {within})"


def _check_gemm_qk(binary: Path) -> FunctionResult:
    rng = np.random.default_rng(76)
    for bf16, D, wg in GEMM_CASES:
        Q, K = _to_bits(rng.standard_normal((128, D)), bf16), _to_bits(rng.standard_normal((128, D)), bf16)
        prefill = np.full((128, 64), 1000.0, np.float32)
        rc, out, msg = _run_full(binary, ["qk", int(bf16), D, wg], Q.tobytes() + K.tobytes() + prefill.tobytes(), 20)
        where = f"[case: {'bf16' if bf16 else 'fp16'}, D = {D}, consumer warpgroup {wg}: its 64 rows of Q_i x 128 keys] "
        if rc != 0:
            return FunctionResult("gemm_qk", "fail", where + _deadlock_or(msg))
        (base, q_addr, k_addr), ops, rest = _gemm_log(out, 3)
        S = np.zeros((64, 128))
        rows, cols = _wgmma_coords(128)
        S[rows, cols] = np.frombuffer(rest, np.float32).reshape(128, 64)
        Qf, Kf = _from_bits(Q, bf16), _from_bits(K, bf16)
        ref = Qf[64 * wg:64 * wg + 64] @ Kf.T
        tol = 1e-3 * np.abs(ref).max() + 1e-3
        if np.abs(S - ref).max() <= tol:
            continue
        if not ops:
            return FunctionResult("gemm_qk", "fail", where + "it issues no WGMMA (S " + (
                "is all zero" if not S.any() else "is not computed") + "): D/16 calls of wgmma_ss_n128")
        expected = [(q_addr + (kk // 4) * H_ROWS * 128 + 32 * (kk % 4), k_addr + (kk // 4) * H_ROWS * 128 + 32 * (kk % 4))
                    for kk in range(D // 16)]
        if any(op["rs"] for op in ops):
            return FunctionResult("gemm_qk", "fail", where + "it calls wgmma_rs: both operands of S = Q K^T are in "
                                  "shared memory, wgmma_ss_n128")
        if any(op["bf16"] != bf16 for op in ops):
            return FunctionResult("gemm_qk", "fail", where + f"its WGMMAs multiply {'bf16' if not bf16 else 'fp16'} "
                                  "values on this type's data: wgmma_ss_n128<T>")
        if len(ops) != D // 16:
            return FunctionResult("gemm_qk", "fail", where + f"{len(ops)} WGMMAs for D = {D}: one per 16 columns of D "
                                  f"(D / 16 = {D // 16}), each a k16 step" + (
                                      "; 4 is the first panel only: a panel holds 64 columns" if len(ops) == 4 else ""))
        for kk, (op, (ea, eb)) in enumerate(zip(ops, expected)):
            for side, got, want, base_addr, what in (("A", op["a"], ea, q_addr, "Q"), ("B", op["b"], eb, k_addr, "K")):
                if got["start"] == want:
                    continue
                if side == "A" and k_addr <= got["start"] < k_addr + 128 * D * 2:
                    return FunctionResult("gemm_qk", "fail", where + "A reads K_j: A is Q_i (q_addr), B is K_j (k_addr)")
                off, want_off = got["start"] - base_addr, want - base_addr
                hint = ""
                if off == 32 * kk and kk >= 4:
                    hint = ("; past 64 columns the step is in the next panel: a 128-byte swizzled panel holds 64 "
                            "columns, so step kk starts in panel kk / 4 at byte 32 * (kk % 4)")
                elif side == "A" and off == (kk // 4) * 64 * 128 + 32 * (kk % 4):
                    hint = ("; Q_i's panels are BLOCK_M * 128 bytes apart: each holds all 128 rows of the tile "
                            "(this warpgroup's 64 start at q_addr)")
                elif off == (kk // 4) * H_ROWS * 128 + 16 * (kk % 4):
                    hint = "; a k16 step is 16 columns of 2 bytes: 32 bytes"
                elif off == 0:
                    hint = "; every step reads the same 16 columns: step kk starts at panel kk / 4, byte 32 * (kk % 4)"
                return FunctionResult("gemm_qk", "fail", where + (
                    f"k-step {kk}: the {side} descriptor ({what}) starts at {what.lower()}_addr "
                    f"{_offset_text(off, H_ROWS * 128)}, expected {_offset_text(want_off, H_ROWS * 128)}" + hint))
            for side, got in (("A", op["a"]), ("B", op["b"])):
                if got["stride"] != 1024:
                    return FunctionResult("gemm_qk", "fail", where + (
                        f"k-step {kk}: the {side} descriptor's stride offset is {got['stride']} bytes: 8-row groups of a "
                        "128-byte swizzled panel are 1024 bytes apart (smem_desc(addr, 16, 1024))"))
            if op["acc"] != (kk > 0):
                return FunctionResult("gemm_qk", "fail", where + (
                    "the first k-step accumulates (accumulate = 1) onto what s held (the previous block's P): it must "
                    "overwrite, accumulate = 0 for kk = 0" if kk == 0 else
                    f"k-step {kk} overwrites s (accumulate = 0): every step after the first adds, accumulate = 1"))
        bad = np.argwhere(np.abs(S - ref) > tol)[0]
        return FunctionResult("gemm_qk", "fail", where + f"S = Q K^T is wrong (first at row {bad[0]}, key {bad[1]}) "
                              "though its descriptors are the expected ones")
    return FunctionResult("gemm_qk", "pass", "S = Q K^T of 64 rows x 128 keys: fp16 and bf16, D = 64 and 128, "
                          "both warpgroups' rows")


def _check_gemm_pv(binary: Path) -> FunctionResult:
    rng = np.random.default_rng(77)
    for bf16, D, _ in GEMM_CASES:
        P = rng.uniform(0, 1, (64, 128)).astype(np.float32)
        V = _to_bits(rng.standard_normal((128, D)), bf16)
        o0 = rng.standard_normal((128, 64)).astype(np.float32)
        rc, out, msg = _run_full(binary, ["pv", int(bf16), D], P.tobytes() + V.tobytes() + o0.tobytes(), 20)
        where = f"[case: {'bf16' if bf16 else 'fp16'}, D = {D}: 64 rows x 128 keys] "
        if rc != 0:
            return FunctionResult("gemm_pv", "fail", where + _deadlock_or(msg))
        (base, v_addr), ops, rest = _gemm_log(out, 2)
        rows, cols = _wgmma_coords(D)
        O = np.zeros((64, D))
        O[rows, cols] = np.frombuffer(rest, np.float32).reshape(128, 64)[:, :D // 2]
        O0 = np.zeros((64, D))
        O0[rows, cols] = o0[:, :D // 2]
        PV = _round(P, bf16) @ _from_bits(V, bf16)
        ref = O0 + PV
        tol = 1e-3 * np.abs(ref).max() + 1e-3
        if np.abs(O - ref).max() <= tol:
            continue
        if not ops:
            return FunctionResult("gemm_pv", "fail", where + "it issues no WGMMA (o comes back unchanged): BLOCK_N/16 "
                                  "calls of wgmma_rs, A = p[kk]")
        if np.abs(O - PV).max() <= tol:
            return FunctionResult("gemm_pv", "fail", where + "o is overwritten with P V: it must accumulate, O += P V "
                                  "(wgmma_rs adds into o; do not zero it)")
        if not all(op["rs"] for op in ops):
            return FunctionResult("gemm_pv", "fail", where + "it calls wgmma_ss_n128: P comes from registers, wgmma_rs")
        if any(op["bf16"] != bf16 for op in ops):
            return FunctionResult("gemm_pv", "fail", where + "its WGMMAs multiply the other 16-bit type: wgmma_rs<T, D>")
        if len(ops) != 128 // 16:
            return FunctionResult("gemm_pv", "fail", where + f"{len(ops)} WGMMAs: one per 16 keys, BLOCK_N / 16 = 8")
        for kk, op in enumerate(ops):
            off = op["b"]["start"] - v_addr
            if off != kk * 16 * 128:
                hint = ("; V is MN-major here (D contiguous): a k-step is 16 key rows of 128 bytes, 16 * 128"
                        if off == 32 * kk else "; every step reads keys 0-15" if off == 0 else "")
                return FunctionResult("gemm_pv", "fail", where + (
                    f"k-step {kk}: the V descriptor starts at v_addr + {off} bytes, expected + {kk * 16 * 128} (16 key "
                    "rows of 128 bytes per step)" + hint))
            if op["kk"] not in (kk, -1):
                return FunctionResult("gemm_pv", "fail", where + f"k-step {kk} multiplies p[{op['kk']}]: keys "
                                      f"16kk..16kk+15 are p[kk]")
            if op["b"]["stride"] != 1024:
                return FunctionResult("gemm_pv", "fail", where + (
                    f"the V descriptor's stride offset is {op['b']['stride']} bytes: groups of 8 key rows are 1024 "
                    "bytes apart"))
            if D == 128 and op["b"]["lead"] != H_ROWS * 128:
                return FunctionResult("gemm_pv", "fail", where + (
                    f"the V descriptor's leading offset is {op['b']['lead']} bytes: for MN-major V it is the distance "
                    f"between the D/64 panels of 64 columns, BLOCK_N * 128 = {H_ROWS * 128}"))
        bad = np.argwhere(np.abs(O - ref) > tol)[0]
        return FunctionResult("gemm_pv", "fail", where + f"O += P V is wrong (first at row {bad[0]}, column {bad[1]}) "
                              "though its descriptors are the expected ones")
    return FunctionResult("gemm_pv", "pass", "O += P V of 64 rows x 128 keys: fp16 and bf16, D = 64 and 128")


def _deadlock_or(msg: str) -> str:
    dl = _deadlock(msg)
    return ("deadlock: " + "; ".join(dl["lines"])) if dl else msg


# ----------------------------------------------------------------------------- consumer_mainloop
def _attention_model(P: Problem, q, k, v, *, mask="needed", wg1_shift=0, rescale_o=True, drop_last_pv=False):
    """The consumers' computation in float64, key blocks right to left, each warpgroup's 64 rows on their
    own (P rounded to the 16-bit type before O += P V, as convert_p does); keywords switch a mistake on."""
    O = np.zeros((P.B, P.Hq, P.Sq, P.D))
    lse = np.full((P.B, P.Hq, P.Sq), -np.inf)
    c, diag, group = P.scale * LOG2E, P.Skv - P.Sq, P.Hq // P.Hkv
    kpad = np.zeros((P.B, P.Hkv, -(-P.Skv // H_ROWS) * H_ROWS, P.D))
    vpad = kpad.copy()
    kpad[:, :, :P.Skv], vpad[:, :, :P.Skv] = k, v
    for _, mb, h, b, nb in _tiles(P):
        for wg in range(2):
            m0 = mb * H_ROWS + 64 * wg
            rows = np.arange(m0, m0 + 64)
            qr = np.zeros((64, P.D))
            qr[rows < P.Sq] = q[b, h, rows[rows < P.Sq]]
            m, l, o = np.full(64, -np.inf), np.zeros(64), np.zeros((64, P.D))
            for j in range(nb - 1, -1, -1):
                n0 = j * H_ROWS
                cols = np.arange(n0, n0 + H_ROWS)
                s = qr @ kpad[b, h // group, n0:n0 + H_ROWS].T
                needs = {"needed": n0 + H_ROWS > P.Skv or (P.causal and n0 + H_ROWS - 1 > m0 + diag),
                         "rightmost": j == nb - 1, "none": False}.get(mask, True)
                if needs:
                    rr = rows - (wg1_shift if wg == 1 else 0)
                    bad = np.zeros(s.shape, bool)
                    if mask != "no_bound":
                        bad |= cols[None, :] >= P.Skv
                    if P.causal and mask != "no_causal":
                        bad |= cols[None, :] > rr[:, None] + diag
                    s = np.where(bad, -np.inf, s)
                with np.errstate(invalid="ignore", over="ignore"):
                    m_new = np.maximum(m, s.max(1) * c)
                    m_use = np.where(m_new == -np.inf, 0.0, m_new)
                    alpha = np.exp2(m - m_use)
                    p = np.exp2(s * c - m_use[:, None])
                l = alpha * l + p.sum(1)
                m = m_new
                if rescale_o:
                    o = o * alpha[:, None]
                if not (drop_last_pv and j == 0):
                    o = o + _round(p, P.bf16) @ vpad[b, h // group, n0:n0 + H_ROWS]
            ok = rows < P.Sq
            with np.errstate(divide="ignore", invalid="ignore"):
                O[b, h, rows[ok]] = np.where(l[ok, None] > 0, o[ok] / l[ok, None], 0.0)
                lse[b, h, rows[ok]] = np.where(l[ok] > 0, (m[ok] + np.log2(l[ok])) * LN2, -np.inf)
    return O, lse


def _attention_close(P: Problem, O, lse, ref_O, ref_lse) -> np.ndarray:
    """[B, Hq, Sq]: rows whose O and lse match."""
    tol = 3e-2 if P.bf16 else 1e-2
    with np.errstate(invalid="ignore"):
        o_ok = (np.abs(O - ref_O) <= tol * (1 + np.abs(ref_O))).all(-1)
        lse_ok = (lse == ref_lse) | (np.abs(lse - ref_lse) <= 2e-3 * (1 + np.abs(np.nan_to_num(ref_lse))))
    return o_ok & lse_ok


_CONSUMER_MISTAKES = (   # (keywords of _attention_model, the cause)
    (dict(rescale_o=False), "O is not rescaled: when a row's running max grows, what O accumulated so far must shrink "
                            "by alpha. Call rescale_o(acc.o, alpha) after each online_softmax_update that follows a "
                            "product, once its wgmma_wait is done"),
    (dict(drop_last_pv=True), "the last O += P V (the leftmost key block, after the loop) is missing: after the loop, "
                              "wait for V of the last ring position and do one more gemm_pv"),
    (dict(mask="rightmost"), "apply_mask is applied to the rightmost key block only: where the causal diagonal of a "
                             "warpgroup's 64 rows reaches into the next block, that block needs it too. Mask every block "
                             "with n0 + BLOCK_N > Skv or (causal) n0 + BLOCK_N - 1 > (the warpgroup's first row) + "
                             "Skv - Sq"),
    (dict(mask="no_causal"), "no causal mask: keys past the diagonal are not masked (apply_mask where a block reaches "
                             "past the causal diagonal of the warpgroup's first row)"),
    (dict(mask="no_bound"), "keys past Skv are not masked: TMA fills them with zeros, so their score is 0, not -inf. "
                            "Mask the block that reaches past Skv (n0 + BLOCK_N > Skv)"),
    (dict(mask="none"), "apply_mask is never applied (keys past Skv and past the causal diagonal count)"),
    (dict(wg1_shift=64), "apply_mask gets the rows of the tile's first warpgroup: row0 = m_block * BLOCK_M + wg * 64 + "
                         "16 * warp + lane / 4, this warpgroup's own rows"),
    (dict(wg1_shift=-64), "apply_mask gets rows 64 further than this warpgroup's: row0 = m_block * BLOCK_M + wg * 64 + "
                          "16 * warp + lane / 4"),
)


def _consumer_deadlock_hint(dl: dict) -> str:
    groups = dl["groups"]
    if any(k[1] == "named" for k in groups):
        return ("the consumer warpgroups wait for each other's GEMM turn: every gemm_turn_begin(wg) needs a "
                "gemm_turn_end(wg) after its GEMMs, and both warpgroups must take the same number of turns")
    for (who, kind, bid, parity), g in groups.items():
        if who != "the producer" and kind == "mbar" and bid in (0, 2, 3, 6, 7) and g["uses"] >= 0 \
                and parity != (g["uses"] & 1):
            return (f"{who} waits on {BARS[bid]} with parity {parity}, but this is its use {g['uses']} of the slot, "
                    f"whose phase has parity {g['uses'] & 1}: wrong parity, or `it` off (full barriers are waited "
                    "with parity phase(it); `it` must advance by one per key block, nb per tile)")
    for (who, kind, bid, parity), g in groups.items():
        if who == "the producer" and bid in _EMPTY_BARS:
            region = {1: "Q", 4: "K slot 0", 5: "K slot 1", 8: "V slot 0", 9: "V slot 1"}.get(bid, "")
            r = REGIONS.index(region) if region in REGIONS else -1
            held = sorted({w for (w, rr), (ph, _) in dl["holds"].items() if rr == r and ph >= 0})
            why = (f"consumer warps {held} still hold it (they waited on its full barrier and never arrived on "
                   f"{BARS[bid]})" if held else f"the consumers did not release it")
            rel = "release(&bars.q_empty, lane) once every S of the tile is done" if bid == 1 else \
                f"release(&bars.{BARS[bid].split('[')[0]}[slot], lane) after the wgmma_wait that ends the GEMM reading it"
            return f"the producer waits for {region} to be released, and {why}: {rel}"
    return "every thread waits"


def _check_consumer(binary: Path) -> FunctionResult:
    for P in CONSUMER_PROBLEMS:
        run = _run_kernel(binary, P, oracle_producer=True, oracle_consumer=False)
        where = f"[case: {P.text()}] "
        if not run.stats:
            return FunctionResult("consumer_mainloop", "fail", where + f"the emulated CTA stopped: {run.message}")
        if run.stats["gemms"] == 0 and run.stats["waits"] == 0:
            return FunctionResult("consumer_mainloop", "fail", where + "the consumers wait for nothing and issue no "
                                  "GEMM: consumer_mainloop does nothing yet")
        if not run.ok:
            dl = _deadlock(run.message)
            if dl is not None:
                return FunctionResult("consumer_mainloop", "fail", where + "deadlock: " + _consumer_deadlock_hint(dl)
                                      + ". (" + "; ".join(dl["lines"]) + ")")
            return FunctionResult("consumer_mainloop", "fail", where + run.message)
        (_, q), (_, k), (_, v) = _inputs(P)
        ref_O, ref_lse = _attention_model(P, q, k, v)
        ok = _attention_close(P, run.o, run.lse, ref_O, ref_lse)
        if ok.all():
            continue
        for mistake, cause in _CONSUMER_MISTAKES:
            alt_O, alt_lse = _attention_model(P, q, k, v, **mistake)
            if not _attention_close(P, alt_O, alt_lse, ref_O, ref_lse).all() and \
                    _attention_close(P, run.o, run.lse, alt_O, alt_lse).all():
                return FunctionResult("consumer_mainloop", "fail", where + cause)
        b, h, r = np.argwhere(~ok)[0]
        with np.errstate(invalid="ignore"):
            o_bad = not np.allclose(run.o[b, h, r], ref_O[b, h, r], atol=3e-2, rtol=3e-2)
        part = ("O and lse are" if o_bad and not np.isclose(run.lse[b, h, r], ref_lse[b, h, r]) else
                "O is" if o_bad else "lse is")
        nan = " (NaN)" if np.isnan(run.o[b, h, r]).any() or np.isnan(run.lse[b, h, r]) else ""
        return FunctionResult("consumer_mainloop", "fail", where + (
            f"{part} wrong{nan} in {int((~ok).sum())} of {ok.size} rows; the first: batch {b}, head {h}, row {r} "
            f"(tile m_block {r // H_ROWS}, consumer warpgroup {(r % H_ROWS) // 64})"))
    return FunctionResult("consumer_mainloop", "pass", f"{len(CONSUMER_PROBLEMS)} problems (fp16, bf16, D = 64 and "
                          "128, causal diagonals, empty rows, five key blocks): O and lse right, the ring protocol kept")


_HOPPER_CHECKS = {"producer": _check_producer, "gemm_qk": _check_gemm_qk, "gemm_pv": _check_gemm_pv,
                  "consumer_mainloop": _check_consumer}
_HOPPER_NEEDS = {"consumer_mainloop": ("gemm_qk", "gemm_pv")}   # it calls them


# ============================================================================= the whole check
_CHECKS = {"load_tile_async": _check_load, "qk_tile": _check_qk, "online_softmax_update": _check_softmax,
           "pv_tile": _check_pv}


def check_device_functions(source, verbose: bool = True, raise_on_failure: bool = True) -> HostCheckReport:
    """Run the CPU check of the step's four device functions (see the module's docstring).

    Prints one line per function and what only a GPU checks; raises :class:`HostCheckError` naming the
    failures (a function still the stub counts as one) when ``raise_on_failure``. Without g++, or when
    g++ cannot compile the file (inline asm of your own, say), it says so and checks nothing."""
    say = print if verbose else (lambda *a, **k: None)
    hopper = step_of(source) == "07"
    functions, checks, gpu_only = ((HOPPER_FUNCTIONS, _HOPPER_CHECKS, HOPPER_GPU_ONLY) if hopper else
                                   (FUNCTIONS, _CHECKS, GPU_ONLY))
    header = "hopper_primitives.cuh" if hopper else "fa_primitives.cuh"
    todo = set(unwritten_functions(source))
    report = HostCheckReport()
    say("CPU check of your device functions (g++ on this machine; " + (
        "one CTA of 384 threads runs the given kernel, TMA, mbarriers and WGMMA emulated after the PTX ISA, each "
        "side of the K/V ring against a correct one):" if hopper else
        "one warp = 32 threads in lockstep, cp.async, ldmatrix and mma.sync emulated after the PTX ISA):"))
    build = report.build = build_host_driver(source)
    if not build.ok:
        why = ("g++ is not installed here" if build.binary is None and "no C++ compiler" in build.log else
               build.log if build.log.startswith(("hopper_", "fa_params")) or " is not next to " in build.log else
               f"g++ could not compile your file against the host stand-in of {header} (inline asm or a CUDA feature "
               "of your own that the stand-in lacks?); nvcc's compile check above is the one that counts")
        say(f"  not checked: {why}")
        if why is not build.log:
            for ln in build.errors():
                say(f"    {ln}")
        report.results = [FunctionResult(f, "todo" if f in todo else "skipped") for f in functions]
        say(gpu_only)
        failed = [r for r in report.results if r.status == "todo"]
        if failed and raise_on_failure:
            raise HostCheckError("not implemented yet: " + ", ".join(r.name for r in failed))
        return report
    for name in functions:
        blocked = [r.name for r in report.results if hopper and r.name in _HOPPER_NEEDS.get(name, ()) and
                   r.status != "pass"]
        if blocked:
            res = (FunctionResult(name, "todo", f'its body is still the stub (FA_TODO("{name}"))') if name in todo else
                   FunctionResult(name, "skipped", f"it calls {' and '.join(blocked)}: checked once "
                                  + ("they pass" if len(blocked) > 1 else "that passes")))
            report.results.append(res)
            say(res.line())
            continue
        try:
            res = checks[name](build.binary)
        except _RunError as err:
            res = FunctionResult(name, "fail", f"{name} was run on " + ("the emulated CTA" if hopper else "one warp")
                                 + f" and {err}")
        if name in todo:       # the stub's marker: not implemented, unless it computes the right thing
            res = (FunctionResult(name, "pass", res.message + f'; its body still carries FA_TODO("{name}"): delete '
                                  "that line") if res.status == "pass" else
                   FunctionResult(name, "todo", f'its body is still the stub (FA_TODO("{name}"))'))
        report.results.append(res)
        say(res.line())
    say(gpu_only)
    if raise_on_failure and report.failures():
        lines = [f"{r.name}: " + ("not implemented yet" if r.status == "todo" else r.message) for r in report.failures()]
        raise HostCheckError("the CPU check of your device functions failed:\n" + "\n".join(lines))
    return report
