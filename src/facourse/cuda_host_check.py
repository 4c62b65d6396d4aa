"""Steps 06 and 07 without a GPU: which device functions are still the stub, and what each written one computes.

    from facourse.cuda_host_check import check_device_functions, unwritten_functions
    unwritten_functions("student_kernel.cu")          # ["qk_tile", ...]: bodies still marked FA_TODO
    check_device_functions("student_kernel.cu")       # prints one line per function; raises HostCheckError

The step is told by the file: a ``student_kernel.cu`` that includes ``hopper_common.cuh`` is step 07's,
any other step 06's. Both compile the student's file and the step's own headers with g++ against the
emulator of the step's PTX instructions (C++ in ``facourse/emu/``, built by ``facourse.emu_build``) and
run each device function on emulated hardware, against a NumPy reference (``facourse.emu_sm80``,
``facourse.emu_hopper``, ``facourse.emu_hopper_gemm``); a wrong output is compared with the classic
mistakes to name the cause. What only a GPU checks is said in the output. The build is cached by the
sources' hash.

**Step 06** (a warp is 32 threads in lockstep; ``ldmatrix``, ``mma.sync``, ``cp.async`` and the
shuffles emulated after the PTX ISA's tables): the four device functions on one warp's fragments, each
on the cases ``facourse.emu_sm80`` lists. Named mistakes: no alpha rescale of O or l, no -inf guard, no
scale, a row max not reduced over its quad, rows past ``rows_valid`` not zero-filled, no swizzle, ...

**Step 07** (one CTA of 384 threads runs the given kernel of ``hopper_harness.cuh``; TMA, mbarriers,
WGMMA and named barriers emulated after the PTX ISA, see ``emu/emu_hopper.h``): the four functions the
student writes are mostly *orchestration* (the arithmetic around them, softmax, mask, epilogue, is
given), so the check runs them as the kernel does, each side of the K/V ring against an oracle: the
producer against consumers that check every slot (``facourse.emu_hopper``), the consumers against a
correct producer and the two GEMMs on one warpgroup (``facourse.emu_hopper_gemm``). Named mistakes:
GQA's head map, key blocks left to right, causal block count, tiles with no key block not skipped,
block instead of element coordinates, a ring position restarted per tile, one panel only, bytes
announced, a missing or wrong-parity wait, descriptors' panel and k-step offsets, accumulate flags, no
fence or commit, reading S or changing O or P in flight, releasing a slot early or from every lane,
masks on the wrong blocks or rows, no rescale of O, the last O += P V missing, ...
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .emu_build import (FunctionResult, HostBuild, RunError, build_host_driver, precompile_std_headers,
                        prebuild_host_check, read_source, step_of, strip_comments)
from .emu_hopper import check_producer
from .emu_hopper_gemm import check_consumer, check_gemm_pv, check_gemm_qk
from .emu_sm80 import CHECKS, c_coords
from .errors import TeachingError

__all__ = ["FUNCTIONS", "GPU_ONLY", "HOPPER_FUNCTIONS", "HOPPER_GPU_ONLY", "FunctionResult", "HostBuild",
           "HostCheckError", "HostCheckReport", "build_host_driver", "c_coords", "check_device_functions",
           "precompile_std_headers", "prebuild_host_check", "report_unwritten", "step_of", "unwritten_functions"]

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


class HostCheckError(TeachingError):
    """A device function computes something wrong on the CPU check (or is not written yet)."""


# ----------------------------------------------------------------------------- the stub's marker
def _functions(source) -> tuple[str, ...]:
    return HOPPER_FUNCTIONS if step_of(source) == "07" else FUNCTIONS


_TODO = re.compile(r"\bFA_TODO\s*\(\s*\"(\w+)\"\s*\)")


def unwritten_functions(source) -> list[str]:
    """Functions whose body still carries the stub's marker ``FA_TODO("name")`` (comments ignored).
    ``source``: a path to student_kernel.cu, or its text."""
    text = read_source(source)
    functions = _functions(text)
    found = set(_TODO.findall(strip_comments(text)))
    return [f for f in functions if f in found] + sorted(found - set(functions))


def report_unwritten(source) -> list[str]:
    """Print which functions are still the stub (nothing when all are written); return them."""
    todo = unwritten_functions(source)
    if todo:
        print(f"Not implemented yet ({len(todo)} of {len(_functions(source))}): {', '.join(todo)}. Their bodies are "
              "still the stub (the line FA_TODO(\"...\") marks it): write them, deleting that line as you do.")
    return todo


@dataclass
class HostCheckReport:
    results: list[FunctionResult] = field(default_factory=list)
    build: HostBuild | None = None

    @property
    def ok(self) -> bool:
        return all(r.status == "pass" for r in self.results)

    def failures(self) -> list[FunctionResult]:
        return [r for r in self.results if r.status in ("fail", "todo")]


_HOPPER_CHECKS = {"producer": check_producer, "gemm_qk": check_gemm_qk, "gemm_pv": check_gemm_pv,
                  "consumer_mainloop": check_consumer}
_HOPPER_NEEDS = {"consumer_mainloop": ("gemm_qk", "gemm_pv")}   # it calls them


# ============================================================================= the whole check
def check_device_functions(source, verbose: bool = True, raise_on_failure: bool = True) -> HostCheckReport:
    """Run the CPU check of the step's four device functions (see the module's docstring).

    Prints one line per function and what only a GPU checks; raises :class:`HostCheckError` naming the
    failures (a function still the stub counts as one) when ``raise_on_failure``. Without g++, or when
    g++ cannot compile the file (inline asm of your own, say), it says so and checks nothing."""
    say = print if verbose else (lambda *a, **k: None)
    hopper = step_of(source) == "07"
    functions, checks, gpu_only = ((HOPPER_FUNCTIONS, _HOPPER_CHECKS, HOPPER_GPU_ONLY) if hopper else
                                   (FUNCTIONS, CHECKS, GPU_ONLY))
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
               f"g++ could not compile your file with the CPU emulator of {header}'s instructions (inline asm or a "
               "CUDA feature of your own that the emulator lacks?); nvcc's compile check above is the one that counts")
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
        except RunError as err:
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
