"""Grade samples of every step end to end on the GPU machine, through nbgrader: the grading times per step.

    python tools/gpu_grading_run.py [--out DIR] [--budget 540] [--resume STATE.tar.gz]
                                    [--steps 01 ... 12] [--students correct stub bug slow]
                                    [--dry-run | --allow-cpu]

The GPU machine has no Jupyter stack: carry ``carry/nbgrader.tar.xz`` (``tools/carry_tilelang.py
--nbgrader``) and start the command with the line that script prints (it unpacks the archive to
/tmp/nbg and sets PYTHONPATH, JUPYTER_PATH and PATH).

What it does:

1. builds ``<work>/submitted/<student>/<assignment>/``. Steps 01-04 and 08-12 (default: every step) grade
   the demo's samples (autograder/samples, tools/make_samples.py): ``correct`` is alice (the solution),
   ``stub`` bob (the untouched release), ``bug`` carol (one planted bug). Steps 05, 06 and 07 build
   four students each here:

   * ``correct``: the solution (05: its cells in the released notebook; 06, 07: the released notebook
     and ladder/student_kernel_solution.cu as the student's student_kernel.cu);
   * ``stub``: the released exercise, untouched (05: the notebook; 06, 07: with its student_kernel.cu);
   * ``bug``: one planted bug of the test modules (imported, not copied): 05
     tests/test_triton_step05.py PLANTED["top_left_causal"] (top-left instead of bottom-right causal:
     loses test_asymmetric and the other tests with Sq != Skv); 06 tests/test_cuda_step06_cpu.py
     BUGS["no_inf_guard"] (no -inf guard in the online softmax: NaN in the rows that see no key, so
     loses test_edge_empty_rows and test_bf16, which has empty_rows); 07 tests/test_hopper_step07_cpu.py
     BUGS["mask_rightmost_only"] (the causal mask on the rightmost key block only: right wherever the
     diagonal crosses one 128-key block, i.e. the five configurations, wrong on the ragged edge cases);
   * ``slow``: a correct kernel slower than the solution, for partial perf points (SLOW below says how
     each is made and what it should earn).

2. grades them with ``python -m autograder --workspace <work>/ws autograde <batch> --jobs 1
   --timeout T``, one assignment at a time, only the submissions whose estimated time (EST, scaled by
   what this run has measured so far) fits in what is left of ``--budget`` seconds; a hard stop kills the
   grading at the budget (a run interrupted midway loses no finished grade). Every graded submission has
   a record in <work>/ws/results; a later call grades only the rest (the autograder skips a submission
   whose record matches), from the same <work> when the machine is still warm, or from ``--resume
   STATE.tar.gz`` (the state.tar.gz of the last call, carried back) on a fresh one.

3. writes the report of everything graded so far (``python -m autograder report``) and puts into
   ``--out`` (default $OUT, else ./out): ``grades.csv``, ``summary.txt`` (the table below),
   ``<date>_<device>_gpu_grading.tar.gz`` (for benchmarks/results/: grades.csv, summary.txt,
   report/index.html, report/students/*.html, report/*.png) and ``state.tar.gz`` (the workspace's
   records, for ``--resume``). The device returns at most 8 files, hence the archives.

Prints a short table last: student, assignment, score, perf points, status, seconds; and
``PENDING: N`` with the command to run again when the budget did not cover every submission.

Without a GPU it refuses to grade unless ``--dry-run`` (builds and validates the 12 submissions:
notebooks valid for nbformat, the planted and slow changes present, and, where g++ is here, the CPU
check of facourse.cuda_host_check on the 06/07 kernels: correct and slow pass it, stub and bug fail it)
or ``--allow-cpu`` (grades here through the same path: the CPU tier runs 05 in Triton's interpreter;
every GPU test scores 0 saying why).
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src"), str(ROOT / "tests")]

STEPS = {"01": "01_vanilla_attention", "02": "02_safe_softmax", "03": "03_online_softmax",
         "04": "04_tiled_attention", "05": "05_triton_flash_attention", "06": "06_cuda_flash_attention",
         "07": "07_hopper_flash_attention", "08": "08_backward", "09": "09_decode_paged_kv",
         "10": "10_attention_variants", "11": "11_interchangeable_kernels", "12": "12_ring_attention",
         "13": "13_profiling", "14": "14_after_hopper", "15": "15_serving"}
STUDENTS = ("correct", "stub", "bug", "slow")
# The steps graded from the demo's samples: which sample student plays which part
SAMPLE_STEPS = ("01", "02", "03", "04", "08", "09", "10", "11", "12", "13", "14", "15")
SAMPLE_OF = {"correct": "alice", "stub": "bob", "bug": "carol"}
# The planted bug of each step: (test module, its table, the row)
BUG = {"05": ("test_triton_step05", "PLANTED", "top_left_causal"),
       "06": ("test_cuda_step06_cpu", "BUGS", "no_inf_guard"),
       "07": ("test_hopper_step07_cpu", "BUGS", "mask_rightmost_only")}
# Estimated seconds per submission on an H100 (nbgrader, kernel start, nvcc + the torch binding for
# 06/07, the judge's tests and two perf cells). The run rescales them by what it measures.
EST = {"05": {"correct": 75, "stub": 30, "bug": 75, "slow": 90},
       "06": {"correct": 150, "stub": 100, "bug": 150, "slow": 165},
       "07": {"correct": 180, "stub": 110, "bug": 180, "slow": 200},
       # the samples: their CPU seconds (autograder/README.md) plus the GPU tests and perf cells
       **{k: {"correct": 20, "stub": 15, "bug": 20} for k in ("01", "02", "03", "04", "12", "13", "14")},
       **{k: {"correct": 60, "stub": 20, "bug": 60} for k in ("08", "09", "10", "11", "15")}}
RELEASE_S = 25          # an autograde process: imports and nbgrader's release of one assignment
RESERVE_S = 35          # the report and the archives at the end
SLOW = {
    "05": "v2_online_softmax's schedule in the solution's kernel: every K/V tile visited and masked "
          "(no causal split), 64x64 tiles, 4 warps, 2 stages. v2 measured 0.56x FA2 on large and 1.02x on "
          "long (benchmarks/results/2026-11-23_h100_step05.json; thresholds min 0.5, target 0.7): "
          "perf_large 1/2, perf_long 2/2 expected",
    "06": "the solution with half of qk_tile's k-steps run twice (the first pass's S multiplied by 0, then "
          "the real one): +25% of the MMA work. The solution measured 0.81x/0.82x FA2 on large/long "
          "(2026-11-23_h100_gpu_selftest.txt); 0.65x (all MMA-bound) to ~0.74x expected: 1/2 each under the "
          "thresholds of that run (min 0.6, target 0.8)",
    "07": "the solution with S computed twice (then halved) for 3 of every 4 key blocks of the mainloop: "
          "+37.5% of the WGMMA work. The solution measured 0.93x/0.95x cuDNN on large/long "
          "(2026-11-23_h100_gpu_selftest.txt); 0.68x (all MMA-bound) to ~0.77x expected: 1/2 each under the "
          "thresholds of that run (min 0.6, target 0.8)",
}


# ----------------------------------------------------------------------------- the submissions
def _replace(text: str, old: str, new: str, what: str) -> str:
    if text.count(old) != 1:
        raise SystemExit(f"{what}: the solution changed ({old[:60]!r} found {text.count(old)} times): update "
                         "tools/gpu_grading_run.py")
    return text.replace(old, new)


def slow_05(code: dict[str, str]) -> dict[str, str]:
    kernel = _replace(code["kernel"], "    # stage 1: off-band tiles, every key visible: no mask\n",
                      "    # slow: v2_online_softmax's schedule: every tile visited, every tile masked\n"
                      "    end_free = 0\n    hi = Skv\n"
                      "    # stage 1: off-band tiles, every key visible: no mask\n", "05 slow kernel")
    wrapper = _replace(code["wrapper"], 'BLOCK_M, BLOCK_N, launch = 128, 64, {"num_warps": 8, "num_stages": 3}',
                       'BLOCK_M, BLOCK_N, launch = 64, 64, {"num_warps": 4, "num_stages": 2}', "05 slow wrapper")
    return {"kernel": kernel, "wrapper": wrapper}


#: Where step 06's S = Q K^T loop starts in its solution: after S is zeroed, the loop over k-steps.
_ZERO06 = "s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;\n"
_LOOP06 = "#pragma unroll\n  for (int kk = 0; kk < D / 16; ++kk) {\n"


def slow_06(solution: str) -> str:
    """Before the k-step loop of S = Q K^T, half of its k-steps run once more (the loop's own body, read
    from the solution), and that S is multiplied by 0 before the real pass adds."""
    if solution.count(_ZERO06) != 1:
        raise SystemExit("06 slow qk_tile: the solution changed (S is not zeroed once): update tools/gpu_grading_run.py")
    start = solution.find(_LOOP06, solution.index(_ZERO06))
    if start < 0:
        raise SystemExit("06 slow qk_tile: the solution changed (no k-step loop after S is zeroed): update "
                         "tools/gpu_grading_run.py")
    end, depth = start + len(_LOOP06), 1
    while depth:                                   # the loop's body, to its closing brace
        depth += {"{": 1, "}": -1}.get(solution[end], 0)
        end += 1
    body = solution[start + len(_LOOP06):end] + "\n"
    redundant = ("  // slow (tools/gpu_grading_run.py): half of the k-steps twice; this pass's S is multiplied by\n"
                 "  // 0 (not dead code: NaN * 0 is no 0, so the compiler keeps it), then the real pass adds.\n"
                 "#pragma unroll\n  for (int kk = 0; kk < D / 32; ++kk) {\n" + body +
                 "#pragma unroll\n  for (int n = 0; n < BLOCK_N / 8; ++n) {\n"
                 "    s[n][0] *= 0.f; s[n][1] *= 0.f; s[n][2] *= 0.f; s[n][3] *= 0.f;\n  }\n")
    return solution[:start] + redundant + solution[start:]


_GEMM_PV07 = "template <typename T, int D>\nHP_DEVICE void gemm_pv("
_LOOP_QK07 = "    gemm_qk<T, D>(s, q_addr, k_addr + sk * L::kKVBytes);                   // S = Q_i K_j^T\n"
_LOOP_WAIT07 = "    pin_registers(s);\n    release(&bars.k_empty[sk], lane);\n"


def slow_07(solution: str) -> str:
    """In the mainloop, 3 of every 4 key blocks get S twice: gemm_qk, then all its k-steps again on top
    (accumulate = 1: 2S, each product the same), halved after the wait. (Issuing extra k-steps before
    gemm_qk's first, accumulate = 0, is not enough: ptxas drops WGMMAs whose results are overwritten.)"""
    helper = ("// slow (tools/gpu_grading_run.py): gemm_qk's k-steps again, added to S (accumulate = 1)\n"
              "template <typename T, int D>\n"
              "HP_DEVICE void gemm_qk_again(float (&s)[BLOCK_N / 2], uint32_t q_addr, uint32_t k_addr) {\n"
              "  wgmma_fence();\n#pragma unroll\n  for (int kk = 0; kk < D / 16; ++kk) {\n"
              "    const uint32_t off = (kk % 4) * 32;\n"
              "    const uint64_t da = smem_desc(q_addr + (kk / 4) * BLOCK_M * 128 + off, 16, 1024);\n"
              "    const uint64_t db = smem_desc(k_addr + (kk / 4) * BLOCK_N * 128 + off, 16, 1024);\n"
              "    wgmma_ss_n128<T>(s, da, db, 1);\n  }\n  wgmma_commit();\n}\n\n\n")
    code = _replace(solution, _GEMM_PV07, helper + _GEMM_PV07, "07 slow helper")
    code = _replace(code, _LOOP_QK07, _LOOP_QK07 +
                    "    if (j & 3) gemm_qk_again<T, D>(s, q_addr, k_addr + sk * L::kKVBytes);  // slow: 2S\n",
                    "07 slow mainloop issue")
    code = _replace(code, _LOOP_WAIT07, "    pin_registers(s);\n"
                    "    if (j & 3) {                       // slow: 2S back to S (exact: a power of 2)\n"
                    "#pragma unroll\n      for (int i = 0; i < BLOCK_N / 2; ++i) s[i] *= 0.5f;\n    }\n"
                    "    release(&bars.k_empty[sk], lane);\n", "07 slow mainloop halving")
    return code


def submissions(steps=tuple(STEPS)) -> dict[tuple[str, str], dict[str, object]]:
    """{(student, assignment): {file name: notebook dict or text}} for ``steps``, every student."""
    import importlib

    import conftest as C
    out = {}
    for step in [k for k in SAMPLE_STEPS if k in steps]:
        a = STEPS[step]
        for role, sample in SAMPLE_OF.items():
            d = ROOT / "autograder" / "samples" / sample / a
            out[(role, a)] = {f.name: (json.loads(f.read_text(encoding="utf-8")) if f.suffix == ".ipynb"
                                       else f.read_text(encoding="utf-8")) for f in sorted(d.iterdir())}
    for step, a in STEPS.items():
        if step in SAMPLE_STEPS or step not in steps:
            continue
        release = C.release_notebook(a)
        (nb_name,) = C.model.notebooks_of(a)
        nb_file = f"{nb_name}.ipynb"
        mod, table, row = BUG[step]
        bugs = getattr(importlib.import_module(mod), table)
        if step == "05":
            solved = C.solution_code(a)
            out[("correct", a)] = {nb_file: C.fill(release, solved)}
            out[("stub", a)] = {nb_file: release}
            out[("bug", a)] = {nb_file: C.fill(release, {**solved, **C.planted_cells(a, bugs[row])})}
            out[("slow", a)] = {nb_file: C.fill(release, {**solved, **slow_05(solved)})}
        else:
            solution = (ROOT / "solutions" / a / "ladder" / "student_kernel_solution.cu").read_text()
            stub = (ROOT / "exercises" / a / "student_kernel.cu").read_text()
            planted = importlib.import_module(mod).planted(row)
            out[("correct", a)] = {nb_file: release, "student_kernel.cu": solution}
            out[("stub", a)] = {nb_file: release, "student_kernel.cu": stub}
            out[("bug", a)] = {nb_file: release, "student_kernel.cu": planted}
            out[("slow", a)] = {nb_file: release, "student_kernel.cu": slow_06(solution) if step == "06"
                                else slow_07(solution)}
    return out


def write_submissions(subs: dict, dest: Path, pairs) -> None:
    for student, a in pairs:
        d = dest / student / a
        d.mkdir(parents=True, exist_ok=True)
        for name, content in subs[(student, a)].items():
            text = json.dumps(content, indent=1, ensure_ascii=False) + "\n" if isinstance(content, dict) else content
            (d / name).write_text(text, encoding="utf-8")


def validate(subs: dict, sub_dir: Path, pairs) -> list[str]:
    """What --dry-run checks: valid notebooks, the changes in place, the CPU check on the 06/07 kernels."""
    import nbformat

    problems = []
    for student, a in pairs:
        for name in subs[(student, a)]:
            p = sub_dir / student / a / name
            if p.suffix == ".ipynb":
                try:
                    nbformat.validate(nbformat.read(p, as_version=4))
                except Exception as e:                      # noqa: BLE001
                    problems.append(f"{student}/{a}/{name}: not a valid notebook: {e}")
    texts = {k: v for k, v in subs.items()}
    for a in {x for _, x in pairs}:
        files = {s: texts[(s, a)] for s in STUDENTS if (s, a) in texts}
        if len({json.dumps(f, sort_keys=True) for f in files.values()}) != len(files):
            problems.append(f"{a}: two students submit the same files")
    if shutil.which("g++") is None:
        print("note: no g++ here: the CPU check of the 06/07 kernels is left out")
        return problems
    from facourse import cuda_host_check as hc
    given = {"06_cuda_flash_attention": ("fa_primitives.cuh", "fa_harness.cuh", "fa_params.h", "fa_binding.cpp"),
             "07_hopper_flash_attention": ("hopper_common.cuh", "hopper_harness.cuh", "hopper_primitives.cuh",
                                           "fa_params.h", "fa_binding.cpp")}
    with tempfile.TemporaryDirectory() as tmp:
        for student, a in pairs:
            if a not in given:
                continue
            d = Path(tmp) / student / a
            d.mkdir(parents=True)
            for f in given[a]:
                shutil.copy(ROOT / "solutions" / a / f, d / f)
            shutil.copy(sub_dir / student / a / "student_kernel.cu", d / "student_kernel.cu")
            t0 = time.time()
            rep = hc.check_device_functions(d / "student_kernel.cu", verbose=False, raise_on_failure=False)
            if not rep.results:
                problems.append(f"{student}/{a}: the CPU check checked nothing (g++ could not build it?)")
                continue
            failures = "; ".join(f"{r.name} {r.status}: {r.message}" for r in rep.failures())
            print(f"  CPU check {student:<8} {a}: {'passes' if rep.ok else 'fails'} ({time.time() - t0:.0f} s)"
                  + ("" if rep.ok else f": {failures[:150]}"), flush=True)
            if rep.ok != (student in ("correct", "slow")):
                problems.append(f"{student}/{a}: the CPU check {'passes' if rep.ok else 'fails'}")
            if student == "bug":                 # it fails naming the planted cause (the test module's words)
                mod, table, row = BUG[[k for k, v in STEPS.items() if v == a][0]]
                import importlib
                words = getattr(importlib.import_module(mod), table)[row][-1]
                missing = [w for w in words if w not in failures]
                if missing:
                    problems.append(f"bug/{a}: the CPU check's failure does not say {missing}: {failures[:300]}")
    return problems


# ----------------------------------------------------------------------------- grading
def device_name() -> str:
    import torch
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name(0).lower()
    for short in ("h100", "h200", "a100", "l4", "l40s", "b200"):
        if short in name:
            return short
    return "".join(c if c.isalnum() else "_" for c in name)[:20]


def recorded(ws: Path, sub_dir: Path, pairs) -> set:
    """The pairs whose record in ``ws`` matches these submissions (the autograder's own test)."""
    from autograder.model import Result, hash_tree, result_path
    from autograder.workers import GRADING_SOURCES, SOLUTIONS
    done = set()
    for student, a in pairs:
        p = result_path(ws, student, a)
        if not p.exists():
            continue
        try:
            prev = Result.from_json(json.loads(p.read_text(encoding="utf-8")))
        except (ValueError, TypeError):
            continue
        if prev.key == hash_tree(sub_dir / student / a) + hash_tree(SOLUTIONS / a, *GRADING_SOURCES):
            done.add((student, a))
    return done


def grading_env() -> dict:
    """This environment with PYTHONPATH made absolute, and src/ on it: the kernels run in each
    submission's folder, where a relative entry (src:.) names nothing, and facourse is not installed
    on the GPU machine."""
    env = dict(os.environ)
    parts = [str((ROOT / p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for extra in (ROOT / "src", ROOT):
        if str(extra) not in parts:
            parts.append(str(extra))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_until(cmd: list[str], deadline: float, log) -> int | None:
    """Run ``cmd`` in its own process group; kill the group at ``deadline`` (None: it was killed)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, bufsize=1, env=grading_env())
    import threading

    def pump():
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        return proc.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        print(f"\n-- budget reached: stopping the grading (pid {proc.pid}); finished grades are kept", flush=True)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return None
    finally:
        t.join(timeout=5)


def grade(steps: dict, work: Path, pairs, budget: float, t_start: float, timeout: float | None, log) -> None:
    ws, sub_dir = work / "ws", work / "submitted"
    deadline = t_start + budget - RESERVE_S
    scale = 1.0
    for step, a in steps.items():
        todo = [(s, x) for s, x in pairs if x == a]
        todo = [p for p in todo if p not in recorded(ws, sub_dir, todo)]
        if not todo:
            continue
        left = deadline - time.time() - RELEASE_S
        batch, need = [], 0.0
        for s, x in todo:
            est = EST[step][s] * scale
            if need + est <= left:
                batch.append((s, x))
                need += est
        if not batch:
            print(f"-- {a}: {len(todo)} submission(s) left, about {EST[step][todo[0][0]] * scale:.0f} s each; "
                  f"{max(0.0, left):.0f} s of the budget left: next call", flush=True)
            continue
        bdir = work / "batch" / a
        shutil.rmtree(bdir, ignore_errors=True)
        for s, x in batch:
            shutil.copytree(sub_dir / s / x, bdir / s / x)
        # a notebook past it scores 0 for good (its record says "timed out"): generous, 3x the estimate,
        # 300-480 s. The budget's hard stop is another matter: it records nothing, the next call grades it.
        per_nb = timeout or min(480.0, max(300.0, 3 * max(EST[step][s] * scale for s, _ in batch)))
        print(f"-- {a}: grading {', '.join(s for s, _ in batch)} (estimated {need:.0f} s; "
              f"{deadline - time.time():.0f} s left; per-notebook timeout {per_nb:.0f} s)", flush=True)
        t0 = time.time()
        cmd = [sys.executable, "-m", "autograder", "--workspace", str(ws), "autograde", str(bdir),
               "--jobs", "1", "--timeout", f"{per_nb:.0f}"]
        run_until(cmd, deadline, log)
        spent = time.time() - t0
        graded = recorded(ws, sub_dir, batch)
        if graded:                       # measured against estimated: rescale what comes next
            est_done = sum(EST[step][s] for s, _ in graded) + RELEASE_S
            scale = min(2.5, max(0.5, spent / est_done))
            print(f"-- {a}: {len(graded)} graded in {spent:.0f} s (estimated {est_done:.0f} s at scale 1): "
                  f"estimates now x{scale:.2f}", flush=True)


# ----------------------------------------------------------------------------- outputs
def perf_points(ws: Path, student: str, a: str) -> str:
    """'3/4 (0.56, 1.02)': the perf cells' points and the ratios the judge measured (GPU tier)."""
    p = ws / "results" / student / f"{a}.json"
    if not p.exists():
        return ""
    d = json.loads(p.read_text(encoding="utf-8"))
    perf = [t for t in d.get("tests", []) if str(t.get("name", "")).startswith("perf_")]
    got, mx = sum(float(t.get("score") or 0) for t in perf), sum(float(t.get("max_score") or 0) for t in perf)
    ratios = [f"{r['ratio']:.2f}" for r in d.get("perf", []) if isinstance(r, dict) and r.get("ratio") is not None]
    return (f"{got:g}/{mx:g}" + (f" ({', '.join(ratios)})" if ratios else "")) if mx else ""


def finish(work: Path, out: Path, name: str, pairs, t_start: float, log) -> int:
    ws = work / "ws"
    rows = []
    if (ws / "results").exists():
        r = subprocess.run([sys.executable, "-m", "autograder", "--workspace", str(ws), "report",
                            "--csv", str(ws / "grades.csv")], cwd=ROOT, capture_output=True, text=True,
                           env=grading_env())
        log.write(r.stdout + r.stderr)
        if r.returncode != 0:
            print(r.stdout[-2000:] + r.stderr[-2000:])
    if (ws / "grades.csv").exists():
        with open(ws / "grades.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    done = {(r["student"], r["assignment"]) for r in rows}
    pending = [p for p in pairs if p not in done]
    lines = [f"{'student':<8} {'assignment':<26} {'score':>7} {'perf (ratios)':<22} {'seconds':>7}  status"]
    order = {s: i for i, s in enumerate(STUDENTS)}
    for r in sorted(rows, key=lambda r: (r["assignment"], order.get(r["student"], 9), r["student"])):
        lines.append(f"{r['student']:<8} {r['assignment']:<26} {r['score']:>3}/{r['max_score']:<3} "
                     f"{perf_points(ws, r['student'], r['assignment']):<22} {float(r['seconds'] or 0):>7.0f}  "
                     f"{r['status'][:60]}")
    for s, a in pending:
        lines.append(f"{s:<8} {a:<26} {'':>7} {'':<22} {'':>7}  PENDING (not graded yet)")
    summary = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    # the folder to commit under benchmarks/results/, as one archive (the device returns at most 8 files)
    pack = work / name
    shutil.rmtree(pack, ignore_errors=True)
    pack.mkdir(parents=True)
    graded = {a for _, a in pairs}
    notes = [f"slow {k}: {v}" for k, v in SLOW.items() if STEPS[k] in graded]
    if any(STEPS[k] in graded for k in SAMPLE_STEPS):
        notes.append("steps " + ", ".join(k for k in SAMPLE_STEPS if STEPS[k] in graded) + ": the demo's samples, "
                     + ", ".join(f"{r} = {n}" for r, n in SAMPLE_OF.items()) + " (autograder/samples)")
    (pack / "summary.txt").write_text(summary + "\n" + "\n".join(notes) + "\n")
    if (ws / "grades.csv").exists():
        shutil.copy(ws / "grades.csv", pack / "grades.csv")
        shutil.copy(ws / "grades.csv", out / "grades.csv")
    if (ws / "report").exists():
        shutil.copytree(ws / "report", pack / "report")
    with tarfile.open(out / f"{name}.tar.gz", "w:gz") as t:
        t.add(pack, arcname=name)
    # the workspace's records, for --resume on a fresh machine
    with tarfile.open(out / "state.tar.gz", "w:gz") as t:
        for sub in ("results", "autograded", "gradebook.db"):
            if (ws / sub).exists():
                t.add(ws / sub, arcname=f"ws/{sub}")
    (out / "summary.txt").write_text(summary)
    print("\n" + summary, end="")
    print(f"{len(pairs) - len(pending)} of {len(pairs)} graded; {time.time() - t_start:.0f} s in all; "
          f"wrote {out / (name + '.tar.gz')}, {out / 'grades.csv'}, {out / 'state.tar.gz'}")
    if pending:
        print(f"PENDING: {len(pending)}: run again with --resume <this state.tar.gz> (carried back) "
              "or at once on the same machine (it resumes from its own work folder)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "out")))
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gpu_grading")
    ap.add_argument("--budget", type=float, default=540, help="seconds for the whole call (default 540)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="per-notebook timeout: past it a notebook scores 0, recorded (default: 3x the "
                         "estimate, 300-480 s)")
    ap.add_argument("--resume", type=Path, help="state.tar.gz of an earlier call (its graded records)")
    ap.add_argument("--steps", nargs="+", default=list(STEPS), choices=list(STEPS))
    ap.add_argument("--students", nargs="+", default=list(STUDENTS), choices=list(STUDENTS))
    ap.add_argument("--name", help="the results folder's name (default <date>_<device>_gpu_grading)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="build and validate the submissions only")
    mode.add_argument("--allow-cpu", action="store_true", help="grade without a GPU (GPU tests score 0)")
    args = ap.parse_args(argv)
    t_start = time.time()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    import torch
    if not (args.dry_run or args.allow_cpu) and not torch.cuda.is_available():
        print("No GPU here: this run grades on the GPU machine. --dry-run builds and validates the "
              "submissions; --allow-cpu grades here anyway (every GPU test scores 0).", file=sys.stderr)
        return 2
    if not args.dry_run:
        try:
            import nbgrader  # noqa: F401
        except ImportError:
            print("nbgrader is not importable: carry carry/nbgrader.tar.xz (tools/carry_tilelang.py --nbgrader) "
                  "and start with the line it prints", file=sys.stderr)
            return 2
    steps = {k: STEPS[k] for k in args.steps}
    subs = submissions(tuple(steps))
    pairs = [(s, a) for a in steps.values() for s in args.students if (s, a) in subs]
    work = args.work.resolve()
    sub_dir = work / "submitted"
    shutil.rmtree(sub_dir, ignore_errors=True)
    write_submissions(subs, sub_dir, pairs)
    print(f"built {len(pairs)} submissions under {sub_dir}")
    for step, why in SLOW.items():
        if STEPS[step] in steps.values():
            print(f"  slow {step}: {why}")
    if args.dry_run:
        problems = validate(subs, sub_dir, pairs)
        for p in problems:
            print(f"PROBLEM: {p}")
        print("dry run: " + ("submissions valid" if not problems else f"{len(problems)} problem(s)"))
        return 1 if problems else 0
    if args.resume:
        with tarfile.open(args.resume) as t:
            t.extractall(work, filter="data")
        print(f"resumed from {args.resume}")
    name = args.name or f"{dt.date.today().isoformat()}_{device_name()}_gpu_grading"
    with open(work / "grading.log", "a", encoding="utf-8") as log:
        grade(steps, work, pairs, args.budget, t_start, args.timeout, log)
        return finish(work, args.out.resolve(), name, pairs, t_start, log)


if __name__ == "__main__":
    sys.exit(main())
