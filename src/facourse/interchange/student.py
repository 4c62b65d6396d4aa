"""Step 11's student kernels: exercise 05's and 06's kernels, read from the student's notebooks, as
solutions of the definition."""
from __future__ import annotations

import json
from pathlib import Path

from .spec import python_solution

#: The exercises whose kernels exercise 11 registers as solutions: step -> (the exercise's folder, the
#: notebook cells (nbgrader grade_id) that define the kernel and what it imports, its entry point, the
#: files beside the notebook that the kernel is built from, the hardware it runs on).
STUDENT_KERNELS = {
    "05": ("05_triton_flash_attention", ("setup", "kernel", "wrapper"), "flash_attention_triton", (),
           ["cpu", "cuda"]),
    "06": ("06_cuda_flash_attention", ("imports", "entry_point"), "flash_attention_cuda",
           ("student_kernel.cu", "fa_binding.cpp", "fa_harness.cuh", "fa_params.h", "fa_primitives.cuh"), ["cuda"]),
}

# a kernel built from files beside its notebook finds them beside its main.py, where FlashInfer-Bench
# writes a solution's sources (exercise 06's cells read this notebook's folder, Path.cwd())
_BESIDE_MAIN = ("KERNEL_DIR = Path(__file__).resolve().parent   # the solution's sources (facourse.interchange)\n"
                'STUDENT_SOURCE = KERNEL_DIR / "student_kernel.cu"\n')


def notebook_cells(path, grade_ids) -> list[str]:
    """The sources of a notebook's code cells ``grade_ids`` (nbgrader's cell ids), in that order."""
    cells = {}
    for c in json.loads(Path(path).read_text(encoding="utf-8"))["cells"]:
        gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if c["cell_type"] == "code" and gid in grade_ids:
            cells[gid] = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    missing = [g for g in grade_ids if g not in cells]
    if missing:
        raise ValueError(f"{path}: no code cell {missing} (is it the course's notebook?)")
    return [cells[g] for g in grade_ids]


def student_solution(folder, step: str):
    """Your kernel of exercise ``step`` ("05": Triton, "06": CUDA) as a flashinfer_bench Solution of the
    definition: the notebook's cells that define it (and the files it is built from) in its sources, and a
    ``run`` in the definition's layout (:func:`definition_run`). ``folder`` is the exercise's folder, with
    the notebook as you saved it. The Triton kernel runs on a CPU in Triton's interpreter (its setup
    cell switches it on without a GPU); the CUDA one needs a GPU."""
    name, cell_ids, entry, files, hardware = STUDENT_KERNELS[step]
    folder = Path(folder)
    cells = notebook_cells(folder / f"{name}.ipynb", cell_ids)
    if files:
        cells.insert(1, _BESIDE_MAIN)
    main = (f'"""Exercise {step}\'s kernel ({entry}), from {name}.ipynb, as a solution of the definition."""\n'
            + "\n\n".join(cells)
            + f"\n\n\nfrom facourse.interchange import definition_run\n\nrun = definition_run({entry})\n")
    beside = {f: (folder / f).read_text(encoding="utf-8") for f in files}
    return python_solution(f"your_{'triton' if step == '05' else 'cuda'}", main,
                           f"exercise {step}'s {entry}, from {folder / (name + '.ipynb')}", author="you",
                           hardware=hardware, files=beside)


def student_solutions(root) -> dict:
    """Your exercise 05 and 06 kernels found under ``root`` (the folder that holds your exercise folders):
    ``{step: Solution, or the reason there is none}``."""
    out = {}
    for step, (name, *_rest) in STUDENT_KERNELS.items():
        try:
            out[step] = student_solution(Path(root) / name, step)
        except (OSError, ValueError) as err:
            out[step] = f"{type(err).__name__}: {err}"
    return out
