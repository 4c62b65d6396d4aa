"""The g++ build and the runs of the CPU check of steps 06 and 07 (``facourse.cuda_host_check``).

The emulator is C++ in ``facourse/emu/`` (package data): ``emu_warp.h`` (a warp of 32 threads, the
shuffles, failures), ``emu_sm80.h`` and ``emu_hopper.h`` (the step's PTX instructions in C++),
``driver_sm80.cpp`` and ``driver_hopper.cpp`` (one program per step: the job named by its first
argument, inputs on stdin, outputs on stdout), stand-ins of the CUDA headers (``emu/include``) and,
for step 06, of ``fa_harness.cuh`` (``emu/sm80``: the device functions run alone). The step's own
headers (``fa_primitives.cuh``, ``hopper_primitives.cuh``, ``hopper_common.cuh``, ``fa_params.h``)
are compiled as they are, from the student's folder, with ``FA_CPU_EMULATION`` leaving their inline
PTX out. Only two files are written for a build: the student's file, under a ``#line`` naming the
real one, and for step 07 the device part of ``hopper_harness.cuh``, its calls of producer and
consumer routed (``emu/routing_hopper.h``), under ``#line`` too: g++'s errors name the real files
and lines. Builds are cached by the content hash of every file they read.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["EMU", "BuildPlan", "FunctionResult", "HostBuild", "RunError", "build_host_driver", "build_plan",
           "cache_root", "prebuild_host_check", "precompile_std_headers", "read_source", "run_driver",
           "run_driver_full", "defined_names", "split_header", "step_of", "strip_comments"]

EMU = Path(__file__).resolve().parent / "emu"
#: the given files each step's build reads from the student's folder (or the one above it: a ladder's)
GIVEN = {"06": ("fa_primitives.cuh", "fa_params.h"),
         "07": ("hopper_common.cuh", "hopper_harness.cuh", "hopper_primitives.cuh", "fa_params.h")}
_FLAGS = {"06": ["-std=c++20", "-O1", "-w"],
          "07": ["-std=c++20", "-O0", "-w"]}   # 07's hot loops are FA_HOT (-O2): the build takes half
_DRIVER = {"06": "driver_sm80.cpp", "07": "driver_hopper.cpp"}
_EMU_FILES = {"06": ("emu_warp.h", "emu_sm80.h", "driver_sm80.cpp", "sm80/fa_harness.cuh"),
              "07": ("emu_warp.h", "emu_hopper.h", "routing_hopper.h", "driver_hopper.cpp")}
_STAND_INS = tuple(f"include/{n}" for n in ("cuda_fp16.h", "cuda_bf16.h", "cuda.h", "cudaTypedefs.h", "cuda_runtime.h"))


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def read_source(source) -> str:
    """The text of ``source``: a path, or the text itself (a string with a newline)."""
    return Path(source).read_text() if not (isinstance(source, str) and "\n" in source) else source


def step_of(source) -> str:
    """"07" for a student_kernel.cu that includes hopper_common.cuh, else "06" (a path or the text)."""
    return "07" if re.search(r'#include\s+"hopper_common\.cuh"', strip_comments(read_source(source))) else "06"


_DEFINED = re.compile(r"(?:FA_DEVICE|HP_DEVICE) [\w:<>]+ (\w+)\(|struct (\w+)(?:<[^>]*>)?\s*\{")


def split_header(text: str) -> tuple[set[str], set[str]]:
    """(the names a step's primitive header defines only where FA_CPU_EMULATION is not set, which the
    emulator must define; the names it defines for both, which the emulator must not restate)."""
    emulated, kept, depth, skip = [], [], 0, None
    for line in strip_comments(text).splitlines():
        s = line.strip()
        if s.startswith("#if"):
            depth += 1
            if s == "#ifndef FA_CPU_EMULATION":
                skip = depth
        elif s.startswith("#endif"):
            skip, depth = (None if skip == depth else skip), depth - 1
        else:
            (emulated if skip else kept).append(line)
    names = [{a or b for a, b in _DEFINED.findall("\n".join(part))} for part in (emulated, kept)]
    return names[0], names[1]


_EMU_DEFINED = re.compile(r"^\s*(?:template <[^>]*>\s*)?(?:static )?(?:FA_HOT )?(?:inline )?[\w:]+ (\w+)\(|"
                          r"^\s*(?:template <[^>]*>\s*)?struct (\w+)[^;\n]*\{", re.M)


def defined_names(text: str) -> set[str]:
    """The functions and structs the emulator's C++ ``text`` defines (declarations aside)."""
    return {a or b for a, b in _EMU_DEFINED.findall(strip_comments(text))}


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
class HostBuild:
    ok: bool
    binary: Path | None
    log: str

    def errors(self, n: int = 8) -> list[str]:
        lines = [ln for ln in self.log.splitlines() if re.search(r"\berror\b", ln)]
        return (lines or self.log.strip().splitlines())[:n]


# ----------------------------------------------------------------------------- what a build reads
@dataclass
class BuildPlan:
    step: str
    source: Path                     # the student's file, as given
    given: Path                      # the folder of the step's headers
    written: dict[str, str] = field(default_factory=dict)   # the files written into the build folder
    flags: list[str] = field(default_factory=list)

    @property
    def driver(self) -> Path:
        return EMU / _DRIVER[self.step]

    def include_dirs(self, build_dir: Path) -> list[str]:
        dirs = [build_dir, *([EMU / "sm80"] if self.step == "06" else []), EMU, EMU / "include", self.given]
        return [a for d in dirs for a in ("-I", str(d))]

    def key(self, cxx: str) -> str:
        """The content hash of every file the build reads, the compiler and the flags."""
        h = hashlib.sha256()
        texts = [*self.written.items(), *((f"given/{n}", (self.given / n).read_text()) for n in GIVEN[self.step]),
                 *((f"emu/{n}", (EMU / n).read_text()) for n in (*_EMU_FILES[self.step], *_STAND_INS))]
        for name, text in sorted(texts):
            h.update(f"{name}\0{text}\0".encode())
        h.update("\0".join([cxx, *self.flags]).encode())
        return h.hexdigest()[:20]


def _line(n: int, path: Path) -> str:
    """A ``#line`` directive: what follows is line ``n`` of ``path`` in g++'s messages."""
    name = path.as_posix().replace("\\", "\\\\").replace('"', '\\"')
    return f'#line {n} "{name}"\n'


_HOST = "// ============================================================================ host"
_NAMESPACE = "namespace hfa {\n"


def _route_harness(text: str, path: Path) -> str | None:
    """The device part of step 07's hopper_harness.cuh, its calls of producer and consumer routed so
    that the driver can put an oracle on either side (None when the file is not the given one)."""
    host, top = text.find(_HOST), text.find(_NAMESPACE)
    if host < 0 or top < 0 or top > host:
        return None
    device = text[:host]
    device, n1 = re.subn(r"\bproducer<D>\(", "(fa_use_oracle_producer ? &fa_oracle_producer<D> : &producer<D>)(",
                         device)
    device, n2 = re.subn(r"\bconsumer<T, D>\((?=smem)",
                         "(fa_use_oracle_consumer ? &fa_oracle_consumer<T, D> : &consumer<T, D>)(", device)
    if n1 != 1 or n2 != 1:
        return None
    top += len(_NAMESPACE)
    line = device[:top].count("\n") + 1
    return (_line(1, path) + device[:top] + '#include "routing_hopper.h"\n' + _line(line, path) + device[top:]
            + "}  // namespace hfa\n")


def _given_folder(source: Path, step: str) -> Path | None:
    for folder in (source.parent, source.parent.parent):
        if all((folder / n).exists() for n in GIVEN[step]):
            return folder
    return None


def build_plan(source) -> BuildPlan | str:
    """What the host build of ``source`` (a path to student_kernel.cu) reads and writes, or why there is none."""
    source = Path(source).resolve()
    text = source.read_text()
    step = step_of(text)
    given = _given_folder(source, step)
    if given is None:
        missing = [n for n in GIVEN[step] if not (source.parent / n).exists()]
        return f"{missing[0]} is not next to {source.name} (the given files of the exercise must be there)"
    plan = BuildPlan(step, source, given, {"student_kernel.cu": _line(1, source) + text}, list(_FLAGS[step]))
    if step == "07":
        harness = _route_harness((given / "hopper_harness.cuh").read_text(), given / "hopper_harness.cuh")
        if harness is None:
            return "hopper_harness.cuh is not the given one (the host check runs its device part)"
        plan.written["hopper_harness.cuh"] = harness
    return plan


# ----------------------------------------------------------------------------- the build, cached
def cache_root() -> Path:
    """Where host builds are kept, one folder per content hash ($FACOURSE_HOST_CHECK_CACHE overrides)."""
    return Path(os.environ.get("FACOURSE_HOST_CHECK_CACHE") or Path(tempfile.gettempdir()) / "facourse_host_check")


_BUILDS: dict[str, Future] = {}          # content hash -> the build (running or done) of this process
_BUILDS_LOCK = threading.Lock()
_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="facourse_host_build")


def _submit_build(source, cxx: str | None, timeout: float) -> Future | HostBuild:
    plan = build_plan(source)
    if isinstance(plan, str):
        return HostBuild(False, None, plan)
    cxx = cxx or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return HostBuild(False, None, "no C++ compiler (g++) on this machine")
    key = plan.key(cxx)
    with _BUILDS_LOCK:
        fut = _BUILDS.get(key)
        if fut is None or _stale(fut):
            fut = _BUILDS[key] = _POOL.submit(_build, plan, cxx, key, timeout)
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
    """g++ -std=c++20 of the step's driver with the student's file and the step's headers; cached by
    content hash (on disk, and a build already under way in this process is waited for, not started again)."""
    fut = _submit_build(source, cxx, timeout)
    return fut if isinstance(fut, HostBuild) else fut.result()


def _std_header_flags(plan: BuildPlan, cxx: str) -> list[str]:
    """Step 07: the C++ standard headers its build includes, precompiled once per cache (a third of each
    build's time is parsing them); the flags that use the header, [] when it cannot be made."""
    if plan.step != "07":
        return []
    emu = "".join((EMU / n).read_text() for n in _EMU_FILES["07"])
    text = "".join(sorted(set(re.findall(r"^#include <[^>]+>\n", emu, re.M))))
    folder = cache_root() / ("pch_" + hashlib.sha256("\0".join([text, cxx, *plan.flags]).encode()).hexdigest()[:16])
    flags = ["-I", str(folder), "-include", "fa_std.h"]
    if (folder / "fa_std.h.gch").exists():
        return flags
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="pch_", dir=folder))
    try:
        (tmp / "fa_std.h").write_text(text)
        r = subprocess.run([cxx, *plan.flags, "-x", "c++-header", str(tmp / "fa_std.h"), "-o",
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


def precompile_std_headers(source, cxx: str | None = None) -> None:
    """Precompile the standard headers of ``source``'s build into the cache now (several processes
    sharing one cache then do not each make them)."""
    plan, cxx = build_plan(source), cxx or shutil.which("g++")
    if not isinstance(plan, str) and cxx:
        _std_header_flags(plan, cxx)


def _build(plan: BuildPlan, cxx: str, key: str, timeout: float) -> HostBuild:
    out = cache_root() / key
    binary = out / "fa_host_driver"
    if binary.exists():
        return HostBuild(True, binary, "cached")
    out.mkdir(parents=True, exist_ok=True)
    pch = _std_header_flags(plan, cxx)
    tmp = Path(tempfile.mkdtemp(prefix="build_", dir=out))
    try:
        for name, text in plan.written.items():
            (tmp / name).write_text(text)
        cmd = [cxx, *plan.flags, *pch, *plan.include_dirs(tmp), str(plan.driver), "-o", str(tmp / "fa_host_driver")]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return HostBuild(False, None, f"g++ did not finish in {timeout:.0f} s")
        if r.returncode != 0:
            return HostBuild(False, None, r.stderr + r.stdout)
        (tmp / "fa_host_driver").replace(binary)       # atomic: a concurrent build never sees half a file
        return HostBuild(True, binary, r.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- runs
class RunError(RuntimeError):
    """The driver did not return a result: the message says how it ended."""


def run_driver(binary: Path, args: list, data: bytes, timeout: float = 20) -> bytes:
    """The driver's stdout for ``args`` and ``data`` on stdin; RunError when it hangs or crashes."""
    try:
        r = subprocess.run([str(binary), *map(str, args)], input=data, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunError(f"it did not return within {timeout:.0f} s (a lane waiting at a shuffle the others "
                       "never reach? every lane of the warp must call the same shuffles)") from None
    if r.returncode != 0:
        msg = r.stderr.decode(errors="replace").strip()
        msg = " ".join(ln.removeprefix("FA_HOST: ") for ln in msg.splitlines()[-3:])
        raise RunError(f"it crashed ({'signal ' + str(-r.returncode) if r.returncode < 0 else 'exit ' + str(r.returncode)}"
                       f"{': ' + msg if msg else ''}; an index out of range?)")
    return r.stdout


def run_driver_full(binary: Path, args: list, data: bytes, timeout: float) -> tuple[int | None, bytes, str]:
    """(exit status or None on a timeout, stdout, the emulation's failure message) of one run."""
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
