"""Build CUDA C++ for the course: a torch extension on a GPU machine, a compile check anywhere.

- ``load_cuda_extension(name, sources, ...)``: ``torch.utils.cpp_extension.load`` with code generated
  for the GPU in this machine (``arch="sm_90a"`` adds Hopper's arch-specific target).
- ``nvcc_compile_check(source, arch="sm_80")``: compiles one .cu file with nvcc alone (no torch
  headers, works with a CPU-only torch, where ``load_inline`` cannot build) with ``-Xptxas -v`` and
  reports errors and, per kernel, registers, spills, stack and static shared memory.
- ``sass_opcodes(source, arch="sm_90a")``: compiles to a cubin (``dump_sass``; or reads the object a compile check of
  the same files made in this process) and counts the machine instructions
  (SASS, by ``cuobjdump``) by opcode: ``HGMMA`` (wgmma), ``UTMALDG`` (TMA loads), ``HMMA``
  (mma.sync), ``LDGSTS`` (cp.async), ``SYNCS`` (mbarrier)... ``check_sass`` says which required
  opcodes are missing (step 07 must use WGMMA and TMA: ``HOPPER_OPCODES``).
"""
from __future__ import annotations

import collections
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TeachingError

__all__ = ["CompileReport", "HOPPER_OPCODES", "KernelResources", "SassCheckError", "ToolUnavailable", "check_sass",
           "count_opcodes", "dump_sass", "find_cuobjdump", "gencode_flag", "load_cuda_extension", "load_hopper_rung",
           "nvcc_compile_check", "nvcc_errors", "sass_opcodes", "sass_summary"]


def gencode_flag(arch: str) -> str:
    """``sm_80`` -> ``-gencode=arch=compute_80,code=sm_80``; ``sm_90a`` -> the compute_90a form
    (the plain ``-arch=sm_90a`` spelling fails on wgmma)."""
    m = re.fullmatch(r"sm_(\d+)(a?)", arch)
    if not m:
        raise ValueError(f"arch must look like 'sm_80' or 'sm_90a', got {arch!r}")
    return f"-gencode=arch=compute_{m[1]}{m[2]},code=sm_{m[1]}{m[2]}"


def _current_arch(hopper_a: bool) -> str:
    import torch
    if not torch.cuda.is_available():
        from .hw import require_gpu
        require_gpu(what="building a CUDA extension")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if hopper_a and (major, minor) == (9, 0) else "")


def load_cuda_extension(name: str, sources, *, arch: str | None = None, include_dirs=(),
                        extra_cuda_cflags=(), extra_cflags=(), build_directory: str | None = None,
                        verbose: bool = False):
    """Build (or reuse) and import a torch extension from .cu/.cpp ``sources``.

    ``arch``: ``None`` for the GPU of this machine, ``"sm_90a"`` to enable Hopper-only instructions
    (on an H100/H200), or any ``"sm_XY"``. Rebuilds only when a source or a flag changed.
    """
    from torch.utils import cpp_extension

    arch = arch or _current_arch(hopper_a=False)
    sources = [str(Path(s).resolve()) for s in sources]
    include_dirs = [str(Path(d).resolve()) for d in include_dirs] or sorted({str(Path(s).parent) for s in sources})
    cuda_flags = ["-O3", "-std=c++17", "-lineinfo", gencode_flag(arch), "-U__CUDA_NO_HALF_OPERATORS__",
                  "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", *extra_cuda_cflags]
    # torch adds its own -gencode list from TORCH_CUDA_ARCH_LIST: make it this GPU's only.
    m = re.fullmatch(r"sm_(\d)(\d+)(a?)", arch)
    old = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{m[1]}.{m[2]}"
    try:
        if build_directory:
            os.makedirs(build_directory, exist_ok=True)
        return cpp_extension.load(name=name, sources=sources, extra_include_paths=include_dirs,
                                  extra_cuda_cflags=cuda_flags, extra_cflags=["-O3", "-std=c++17", *extra_cflags],
                                  build_directory=build_directory, verbose=verbose)
    finally:
        if old is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = old


def load_hopper_rung(name: str, sources, include_dirs=(), extra_cuda_cflags=()):
    """A CUDA rung built on step 07's headers (step 07's folder and its ladder/ on the include path, after
    ``include_dirs``), for sm_90a: steps 08 and 10's Hopper rungs."""
    from .steps import step_dir
    step07 = step_dir("07")
    return load_cuda_extension(name, sources, arch="sm_90a", include_dirs=[*include_dirs, step07 / "ladder", step07],
                               extra_cuda_cflags=extra_cuda_cflags)


# ----------------------------------------------------------------------------- compile check
@dataclass
class KernelResources:
    name: str               # demangled when possible
    arch: str
    registers: int = 0
    spill_stores: int = 0   # bytes
    spill_loads: int = 0    # bytes
    stack: int = 0          # bytes of stack frame
    smem: int = 0           # bytes of static shared memory (dynamic shared memory is set at launch)
    barriers: int = 0

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads

    def line(self) -> str:
        return (f"{self.name[:70]:70s} {self.arch:7s} {self.registers:4d} regs  "
                f"{self.spill_stores:4d}/{self.spill_loads:<4d} B spilled (st/ld)  {self.stack:4d} B stack  "
                f"{self.smem:6d} B static smem")


@dataclass
class CompileReport:
    ok: bool
    arch: str
    command: list[str]
    log: str                                   # nvcc's stderr + stdout, as is
    errors: list[str] = field(default_factory=list)
    kernels: list[KernelResources] = field(default_factory=list)

    @property
    def spills(self) -> int:
        return sum(k.spills for k in self.kernels)

    @property
    def wgmma_notes(self) -> list[str]:
        """ptxas's C75xx notes: WGMMAs serialised (registers short, or an accumulator read or written by other
        instructions while a product is in flight), or a wait or fence ptxas had to insert itself."""
        return [ln.strip() for ln in self.log.splitlines() if _WGMMA_NOTE.search(ln)]

    def summary(self) -> str:
        if not self.ok:
            head = f"nvcc FAILED for {self.arch}: {len(self.errors)} error(s)"
            return "\n".join([head, *self.errors[:20]])
        lines = [f"nvcc OK for {self.arch}: {len(self.kernels)} kernel(s)"]
        lines += ["  " + k.line() for k in self.kernels]
        if self.spills:
            lines.append("  WARNING: register spills (local memory traffic): reduce live registers")
        if self.wgmma_notes:
            lines.append("  WARNING: ptxas changed the WGMMA pipeline (each costs speed):")
            lines += ["    " + n[:200] for n in dict.fromkeys(self.wgmma_notes)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    try:
        out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=30).stdout
        dem = out.splitlines()
        return dict(zip(names, dem)) if len(dem) == len(names) else {n: n for n in names}
    except (OSError, subprocess.SubprocessError):
        return {n: n for n in names}


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_WGMMA_NOTE = re.compile(r"\(C75\d\d\)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARS = re.compile(r"used (\d+) barriers")


def parse_ptxas(log: str) -> list[KernelResources]:
    """Kernels with their resources, from the text ``-Xptxas -v`` prints (CUDA 11-13 formats)."""
    kernels: dict[str, KernelResources] = {}
    current = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = kernels.setdefault(m[1], KernelResources(m[1], m[2]))
            continue
        if m := _PROPS.search(line):
            current = kernels.get(m[1], current)
            continue
        if current is None:
            continue
        if m := _FRAME.search(line):
            current.stack, current.spill_stores, current.spill_loads = int(m[1]), int(m[2]), int(m[3])
        if m := _USED.search(line):
            current.registers = int(m[1])
            if s := _SMEM.search(line):
                current.smem = int(s[1])
            if b := _BARS.search(line):
                current.barriers = int(b[1])
    names = _demangle(list(kernels))
    for k in kernels.values():
        k.name = names.get(k.name, k.name)
    return list(kernels.values())


def _find_nvcc(nvcc: str | None = None) -> str | None:
    """``nvcc`` if given, else the one on PATH, else the toolkit's default place; None when absent."""
    default = Path("/usr/local/cuda/bin/nvcc")
    return nvcc or shutil.which("nvcc") or (str(default) if default.exists() else None)


def _source_file(source, tmp: str, include_dirs) -> tuple[Path, list[str]]:
    """``source`` (a .cu path, or CUDA source text written into ``tmp``) as a file, and the -I folders
    (``include_dirs``, or the source's own folder)."""
    src = Path(source) if not (isinstance(source, str) and "\n" in source) else None
    if src is None:
        src = Path(tmp) / "source.cu"
        src.write_text(source)
    elif not src.exists():
        raise FileNotFoundError(f"no CUDA source at {src}")
    return src, [str(Path(d).resolve()) for d in include_dirs] or [str(src.resolve().parent)]


# What nvcc made in this process, by the content of what it read: a compile check's object (or cubin) holds the
# SASS a later dump_sass of the same files asks for (step 07's notebook compiles, then reads the SASS: 7 CPU-s).
_MADE: dict[str, tuple[str, bytes]] = {}
_MADE_LOCK = threading.Lock()          # compile checks may run on several threads (the tests' pool)
_HEADER_SUFFIXES = (".h", ".cuh", ".cu", ".hpp", ".cpp", ".inc")


def _content_key(nvcc: str, src: Path, dirs, arch: str, extra) -> str:
    """The source, every header in its folder and the -I folders, nvcc, the target and the flags."""
    h = hashlib.sha256("\0".join([str(Path(nvcc).resolve()), arch, *extra]).encode())
    h.update(src.read_bytes())
    for d in dict.fromkeys([str(src.resolve().parent), *map(str, dirs)]):
        for f in sorted(Path(d).iterdir()) if Path(d).is_dir() else ():
            if f.suffix in _HEADER_SUFFIXES and f.is_file():
                h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _remember(key: str, path: Path) -> None:
    made = (path.suffix, path.read_bytes())
    with _MADE_LOCK:
        if len(_MADE) >= 8:
            _MADE.pop(next(iter(_MADE)))
        _MADE[key] = made


# nvcc's closing count ("2 errors detected in the compilation of "x.cu".") is no error of its own
_ERROR_SUMMARY = re.compile(r"^\d+ errors? detected in the compilation of ")
_ERROR_LINE = re.compile(r"\b(error|fatal)\b", re.I)


def nvcc_errors(log: str) -> list[str]:
    """The error lines of an nvcc log: front end (``x.cu(12): error: ...``), host compiler, ptxas and
    ``nvcc fatal``; not the source lines nvcc echoes under them (indented) nor its closing count."""
    return [ln for ln in log.splitlines()
            if ln and not ln[0].isspace() and _ERROR_LINE.search(ln) and not _ERROR_SUMMARY.match(ln)]


def nvcc_compile_check(source, arch: str = "sm_80", extra=(), include_dirs=(), nvcc: str | None = None,
                       timeout: float = 300, verbose: bool = True, host: bool = True) -> CompileReport:
    """Compile ``source`` (a path to a .cu file, or CUDA source text) to an object file for ``arch``
    with ``-Xptxas -v``; return (and print, when ``verbose``) errors, registers, spills, smem.
    ``host=False`` compiles the device code alone (``-cubin``: no host compiler, about a third faster)."""
    nvcc = _find_nvcc(nvcc) or "nvcc"
    with tempfile.TemporaryDirectory(prefix="facourse_nvcc_") as tmp:
        src, dirs = _source_file(source, tmp, include_dirs)
        out = ["-c", str(src), "-o", str(Path(tmp) / "out.o")] if host else \
            ["-cubin", str(src), "-o", str(Path(tmp) / "out.cubin")]
        cmd = [nvcc, *out, gencode_flag(arch), "-std=c++17", "-O3",
               "-Xptxas", "-v", *[f"-I{d}" for d in dirs], *extra]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            log, ok = r.stderr + r.stdout, r.returncode == 0
            if ok:
                _remember(_content_key(nvcc, src, dirs, arch, extra), Path(out[3]))
        except FileNotFoundError:
            log, ok = f"nvcc not found ({nvcc}): install the CUDA toolkit to check CUDA code on this machine", False
        except subprocess.TimeoutExpired:
            log, ok = f"nvcc did not finish in {timeout:.0f} s", False
    errors = nvcc_errors(log) if not ok else []
    if not ok and not errors:
        errors = log.strip().splitlines()[-10:]
    rep = CompileReport(ok, arch, cmd, log, errors, parse_ptxas(log) if ok else [])
    if verbose:
        print(rep.summary())
    return rep


# ----------------------------------------------------------------------------- SASS
class ToolUnavailable(RuntimeError):
    """A CUDA tool (nvcc, cuobjdump) is not installed here. The message says how to get it."""


class SassCheckError(TeachingError):
    """The compiled kernel lacks instructions it must use. The message names them and what is there."""


#: What each opcode of interest is, in the PTX a student writes (for reports and error messages).
OPCODE_MEANING = {
    "HGMMA": "warpgroup MMA, wgmma.mma_async (Hopper tensor cores)",
    "UTMALDG": "TMA tensor load, cp.async.bulk.tensor (global -> shared)",
    "UTMASTG": "TMA tensor store (shared -> global)",
    "SYNCS": "mbarrier operations (init, arrive, expect-tx, try_wait)",
    "USETMAXREG": "setmaxnreg (register reallocation between warpgroups)",
    "HMMA": "warp MMA, mma.sync (Ampere-style tensor cores)",
    "LDSM": "ldmatrix (shared -> registers)",
    "LDGSTS": "cp.async (Ampere-style asynchronous copy)",
}

#: The opcodes step 07's kernel must contain, and why (the hidden structural check).
HOPPER_OPCODES = {
    "HGMMA": "S = Q_i K_j^T and O_i += P V_j must run on WGMMA (wgmma.mma_async: gemm_qk, gemm_pv)",
    "UTMALDG": "Q_i, K_j and V_j must arrive by TMA (cp.async.bulk.tensor: tma_load_4d in the producer)",
}


def _nvidia_wheel_bins():
    """bin/ folders of NVIDIA's pip wheels (nvidia-cuda-cuobjdump: nvidia/cu13/bin or
    nvidia/cuda_cuobjdump/bin), without importing anything heavy."""
    try:
        import nvidia
    except ImportError:
        return []
    bins = []
    for base in getattr(nvidia, "__path__", []):
        bins += sorted(Path(base).glob("cu*/bin")) + sorted(Path(base).glob("cuda_cuobjdump/bin"))
    return bins


def cubin_usage(cubin: bytes) -> dict[str, int]:
    """A cubin's resources as ``cuobjdump --dump-resource-usage`` reads them (one kernel): REG (registers a thread),
    STACK (bytes a thread: where ptxas spills), SHARED (static bytes), among others."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([find_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    return {k: int(v) for k, v in re.findall(r"\b([A-Z]+):(\d+)", out)}


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, in the CUDA toolkit, or from the ``nvidia-cuda-cuobjdump`` pip package."""
    if tool := shutil.which("cuobjdump"):
        return tool
    dirs = [Path(os.environ[v]) / "bin" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    if nvcc := shutil.which("nvcc"):
        dirs.append(Path(nvcc).resolve().parent)
    dirs += [Path("/usr/local/cuda/bin"), *_nvidia_wheel_bins()]
    for d in dirs:
        if (d / "cuobjdump").is_file():
            return str(d / "cuobjdump")
    return None


# One SASS line: "/*0230*/  @!P0 HGMMA.64x128x16.F32 R24, gdesc[UR4], RZ, !UPT ;" -> "HGMMA"
_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def count_opcodes(sass: str) -> collections.Counter:
    """Opcode (the first dotted token: ``HGMMA.64x128x16.F32`` counts as ``HGMMA``) -> count."""
    return collections.Counter(m[1] for line in sass.splitlines() if (m := _SASS_LINE.match(line)))


def sass_opcodes(source, arch: str = "sm_90a", include_dirs=(), extra=(), nvcc: str | None = None,
                 timeout: float = 300) -> collections.Counter:
    """Compile ``source`` (a .cu path or CUDA source text) to a cubin for ``arch`` and count its SASS
    instructions by opcode, over every kernel and template instance in it (``dump_sass``'s text)."""
    return count_opcodes(dump_sass(source, arch, include_dirs, extra, nvcc, timeout))


def dump_sass(source, arch: str = "sm_90a", include_dirs=(), extra=(), nvcc: str | None = None,
              timeout: float = 300) -> str:
    """``cuobjdump --dump-sass`` of ``source`` (a .cu path or CUDA source text) compiled to a cubin for ``arch``
    with nvcc's ``extra`` flags: every kernel and template instance in it.

    Raises :class:`ToolUnavailable` without nvcc or cuobjdump (``pip install nvidia-cuda-cuobjdump
    nvidia-cuda-nvdisasm``), and ``RuntimeError`` with nvcc's errors when the source does not compile.
    """
    nvcc = _find_nvcc(nvcc)
    if nvcc is None:
        raise ToolUnavailable("nvcc is not installed here: install the CUDA toolkit to compile and inspect CUDA code")
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        raise ToolUnavailable("cuobjdump is not installed here, so the SASS cannot be read: "
                              "`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` (or the full CUDA toolkit)")
    with tempfile.TemporaryDirectory(prefix="facourse_sass_") as tmp:
        src, dirs = _source_file(source, tmp, include_dirs)
        key = _content_key(nvcc, src, dirs, arch, extra)
        made = _MADE.get(key)
        if made:
            suffix, data = made
            cubin = Path(tmp) / ("made" + suffix)
            cubin.write_bytes(data)
        else:
            cubin = Path(tmp) / "out.cubin"
            cmd = [nvcc, "-cubin", str(src), "-o", str(cubin), gencode_flag(arch), "-std=c++17", "-O3",
                   *[f"-I{d}" for d in dirs], *extra]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"nvcc did not finish in {timeout:.0f} s") from None
            if r.returncode != 0:
                errs = nvcc_errors(r.stderr + r.stdout)
                raise RuntimeError(f"nvcc failed for {arch}:\n" + "\n".join((errs or (r.stderr + r.stdout).splitlines())[:20]))
            _remember(key, cubin)
        env = dict(os.environ)      # cuobjdump runs nvdisasm, which the pip wheels put next to it
        tool_dir = str(Path(cuobjdump).parent)
        env["PATH"] = tool_dir + os.pathsep + env.get("PATH", "")
        if (Path(tool_dir) / "nvdisasm").is_file():
            env.setdefault("NVDISASM_PATH", str(Path(tool_dir) / "nvdisasm"))
        d = subprocess.run([cuobjdump, "--dump-sass", str(cubin)], capture_output=True, text=True,
                           timeout=timeout, env=env)
        if d.returncode != 0:
            raise ToolUnavailable(f"cuobjdump could not read the cubin: {(d.stderr or d.stdout).strip()[:500]}")
    return d.stdout


def sass_summary(counts: collections.Counter) -> str:
    """The opcodes of OPCODE_MEANING with their counts, one line each."""
    rows = [f"  {op:10s} {counts.get(op, 0):6d}  {what}" for op, what in OPCODE_MEANING.items()]
    return f"SASS: {sum(counts.values())} instructions; the ones that tell the design apart:\n" + "\n".join(rows)


def check_sass(source, required: dict[str, str] | None = None, arch: str = "sm_90a", include_dirs=(),
               verbose: bool = True) -> collections.Counter:
    """Compile ``source`` and require every opcode of ``required`` (default :data:`HOPPER_OPCODES`)
    in its SASS; raise :class:`SassCheckError` naming what is missing (and the Ampere-style
    instructions found instead). Returns the counts; prints them when ``verbose``."""
    required = HOPPER_OPCODES if required is None else required
    counts = sass_opcodes(source, arch, include_dirs=include_dirs)
    if verbose:
        print(sass_summary(counts))
    missing = [op for op in required if counts.get(op, 0) == 0]
    if missing:
        lines = [f"the compiled kernel has no {op} instruction: {required[op]}" for op in missing]
        instead = [f"{op} x{counts[op]}" for op in ("HMMA", "LDSM", "LDGSTS") if counts.get(op)]
        if instead:
            lines.append("found instead: " + ", ".join(instead) + " (mma.sync, ldmatrix, cp.async: step 06's "
                         "instructions, not Hopper's)")
        raise SassCheckError("\n".join(lines))
    if verbose:
        print("found " + " and ".join(f"{op} x{counts[op]}" for op in required))
    return counts
