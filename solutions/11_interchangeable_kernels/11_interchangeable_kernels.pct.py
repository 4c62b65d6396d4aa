# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch
from flashinfer_bench import (AxisConst, AxisVar, BuildSpec, Definition, Solution, SourceFile, TensorSpec,
                              apply, enable_apply)
from flashinfer_bench.compile import BuilderRegistry

from facourse import interchange as fx

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Exercise 11 — one operator, interchangeable kernels
#
# By now the course has several kernels for one operator: your Triton kernel (step 05), your CUDA kernel
# (step 06), a Hopper kernel (step 07), a TileLang one (`course/11_interchangeable_kernels.ipynb`). A
# serving system must pick one for every call, and must never pick one that is wrong on that call's
# shape. [FlashInfer-Bench](https://github.com/flashinfer-ai/flashinfer-bench) (imported as
# `flashinfer_bench`) gives the pieces, and you will put them together:
#
# 1. a **`Definition`**: the operator, once (its axes, its tensors, a PyTorch reference);
# 2. **`Trace`s**: every `Solution` run on every `Workload` (one concrete shape) and checked, with
#    the course's one correctness rule (and timed, on a GPU);
# 3. a **deployment**: `enable_apply` reads the traces, and `apply()` sends each call to the fastest
#    solution that *passed* on that shape, or to your fallback.
#
# **The operator** (the spec you will write down in part 1): `mini_flash_attention_prefill`, op_type
# `gqa_ragged`, `run(q, k, v, causal) -> out`, with `q [batch, seq_q, num_heads, head_dim]`,
# `k, v [batch, seq_kv, num_kv_heads, head_dim]`, all float16, `causal` a scalar bool, `out` like `q`.
# `batch`, `seq_q` and `seq_kv` change from call to call; `num_heads = 32`, `num_kv_heads = 8` and
# `head_dim = 128` are fixed. The layout `[batch, seq, heads, dim]` is the course's `[B, H, S, D]`
# transposed (a view: `fx.to_course(q, k, v)`, `fx.from_course(o)`), and the meaning is the course's:
# query head `h` reads KV head `h // 4`, causal is aligned bottom-right (key `j` is visible to query
# `i` iff `j <= i + seq_kv - seq_q`), a row that sees no key is 0.
#
# **What is graded** (30 points, all on a CPU): the definition's fields (5) and its reference (5); the
# traces (10); the deployment: its routing (5) and its fallback (5). The hidden tests run the same checks as the visible cells, with
# inputs, solution names and tags drawn from seeds you do not see.

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_definition", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Part 1: the definition
#
# Write `make_definition()`, returning a `flashinfer_bench.Definition` with
#
# * `name`, `op_type` as above;
# * `axes`: `AxisVar()` for the three that vary, `AxisConst(value=...)` for the three that are fixed
#   (a const axis is a promise every solution may rely on: a kernel compiled for 128-wide heads);
# * `inputs` `q, k, v` as `TensorSpec(shape=[axis names...], dtype="float16")`, in the calling order,
#   and `causal` as a scalar: `TensorSpec(shape=None, dtype="bool")`; `outputs` `out`;
# * `reference`: Python source text defining `run(q, k, v, causal)`, attention in PyTorch in the
#   definition's layout (compute in float32, return float16). Every solution is checked against what
#   this function means, so it must be right on every shape: GQA, and causal bottom-right on
#   `seq_q != seq_kv` (PyTorch's `is_causal=True` is top-left, the wrong one here).
#
# `fx.check_definition(d)` compares the fields with the spec and says why a difference matters;
# `fx.check_definition_reference(run)` runs a reference on six small shapes with the course's rule.

# %% nbgrader={"grade": false, "grade_id": "definition", "locked": false, "schema_version": 3, "solution": true, "task": false}
def make_definition() -> Definition:
    """The operator, as a flashinfer_bench Definition (axes, inputs, outputs, a PyTorch reference)."""
    ### BEGIN SOLUTION
    reference = '''
import math
import torch


def run(q, k, v, causal):
    """Attention in the definition's layout [batch, seq, heads, dim]; float32 inside, q's dtype out."""
    seq_q, heads, dim = q.shape[1], q.shape[2], q.shape[3]
    seq_kv, kv_heads = k.shape[1], k.shape[2]
    qh = q.transpose(1, 2).float()                                          # [batch, heads, seq_q, dim]
    kh = k.transpose(1, 2).float().repeat_interleave(heads // kv_heads, dim=1)
    vh = v.transpose(1, 2).float().repeat_interleave(heads // kv_heads, dim=1)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(dim)                          # S = Q K^T / sqrt(d)
    if causal:                                                              # bottom-right aligned
        i = torch.arange(seq_q, device=q.device)[:, None]
        j = torch.arange(seq_kv, device=q.device)[None, :]
        s = s.masked_fill(j > i + (seq_kv - seq_q), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)                            # a row with no key: 0
    return (p @ vh).transpose(1, 2).to(q.dtype)
'''
    fp16 = "float16"
    return Definition(
        name="mini_flash_attention_prefill",
        op_type="gqa_ragged",
        axes={"batch": AxisVar(), "seq_q": AxisVar(), "seq_kv": AxisVar(),
              "num_heads": AxisConst(value=32), "num_kv_heads": AxisConst(value=8), "head_dim": AxisConst(value=128)},
        inputs={"q": TensorSpec(shape=["batch", "seq_q", "num_heads", "head_dim"], dtype=fp16),
                "k": TensorSpec(shape=["batch", "seq_kv", "num_kv_heads", "head_dim"], dtype=fp16),
                "v": TensorSpec(shape=["batch", "seq_kv", "num_kv_heads", "head_dim"], dtype=fp16),
                "causal": TensorSpec(shape=None, dtype="bool")},
        outputs={"out": TensorSpec(shape=["batch", "seq_q", "num_heads", "head_dim"], dtype=fp16)},
        reference=reference,
        tags=["stage:prefill", "attention:flash"],
    )
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_definition", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
fx.check_definition(make_definition())
print("the definition's fields match the spec")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_definition", make_definition)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_definition_reference", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
fx.check_definition_reference(fx.definition_reference_run(make_definition()))
print("the definition's reference passes the course's check on the CPU shapes")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_definition_reference", make_definition)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_traces", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Part 2: traces
#
# A `Solution` is a kernel packaged for a definition: its language, the hardware it targets, its source
# files and an entry point `"file.py::function"`. `BuilderRegistry.get_instance().build(definition,
# solution)` turns it into a callable in the definition's convention (it imports a Python or Triton
# solution's files; a CUDA or TileLang solution needs their toolchain, and its build raises where they
# are missing). For example, a solution that wraps a course-contract kernel:

# %% nbgrader={"grade": false, "grade_id": "solution_example", "locked": true, "schema_version": 3, "solution": false, "task": false}
EXAMPLE_SOURCE = '''


def run(q, k, v, causal):
    o, _ = reference_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal)
    return o.transpose(1, 2).to(q.dtype)
'''
example = Solution(name="torch_reference", definition="mini_flash_attention_prefill", author="you",
                   spec=BuildSpec(language="python", target_hardware=["cpu", "cuda"], entry_point="main.py::run",
                                  destination_passing_style=False),
                   sources=[SourceFile(path="main.py", content=EXAMPLE_SOURCE)])
print([w.axes for w in fx.workloads("cpu")])

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_traces_2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Write `trace_solutions(definition, solutions, workloads)`: every solution on every workload, one
# `Trace` each, in a list. Build each solution once; `fx.trace(definition, solution, run, workload)`
# draws the workload's inputs, calls `run`, checks the output with the course's rule (and times it
# against SDPA on a GPU) and returns the `Trace`: PASSED, or INCORRECT_NUMERICAL (the check's message
# in `evaluation.log`), INCORRECT_SHAPE, INCORRECT_DTYPE, RUNTIME_ERROR. A solution whose build raises
# is traced too: pass the exception in place of `run`, and the trace says COMPILE_ERROR. One broken
# solution must not stop the others from being traced (about 8 lines).
#
# The check hands your function four candidates with meaningless names: one correct, one with top-left
# causal, one that raises, one that does not build, on three small shapes.

# %% nbgrader={"grade": false, "grade_id": "trace_solutions", "locked": false, "schema_version": 3, "solution": true, "task": false}
def trace_solutions(definition, solutions, workloads) -> list:
    """One flashinfer_bench Trace per (solution, workload): built, run, checked (and timed on a GPU)."""
    ### BEGIN SOLUTION
    registry = BuilderRegistry.get_instance()
    traces = []
    for solution in solutions:
        try:
            run = registry.build(definition, solution)
        except Exception as err:        # no toolchain, a syntax error: COMPILE_ERROR on every workload
            run = err
        traces += [fx.trace(definition, solution, run, w) for w in workloads]
    return traces
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_traces", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
fx.check_traces(trace_solutions)
print("every candidate traced with the right status")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_traces", trace_solutions)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "task_deploy", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Part 3: the deployment
#
# `fx.save_trace_set(root, definition, solutions, workloads, traces)` writes a folder that
# `enable_apply(root, config)` reads. From then on `apply(name, args=(q, k, v, causal), fallback=f)`
# looks the call's var axes up in a table of the fastest PASSED trace per shape and calls that solution,
# or `f(q, k, v, causal)` when the shape has no such trace.
#
# Write `deploy(root)`: enable apply on the trace set in `root` and return a function `attn(q, k, v,
# causal) -> out` that routes each call through `apply()`. It must be safe:
#
# * only PASSED traces count, the fastest of them per shape (apply's table does this, with tolerances
#   that let the course's PASSED traces through: `fx.apply_config()`; flashinfer_bench's default
#   `ApplyConfig` has `max_rtol=1e-5` and drops every float16 trace);
# * a shape with no trace goes to the fallback, never to a solution that was not checked on it
#   (`on_miss_policy="fallback_only"`, as in `fx.apply_config()`);
# * the fallback is correct on every shape, if slow: the definition's own reference is (part 1
#   checked it), and `fx.definition_reference_run(definition)` gives its `run`.
#
# About 6 lines. The check writes a trace set of three tagged solutions: on one shape the fastest
# solution failed its check, on another a different solution wins, a third shape has no trace; it
# reads from each output which solution served it. Routing (5 points) and the fallback (5 points) are
# graded apart.

# %% nbgrader={"grade": false, "grade_id": "deploy", "locked": false, "schema_version": 3, "solution": true, "task": false}
def deploy(root):
    """attn(q, k, v, causal) -> out, routed by apply() over the traces in root, with a safe fallback."""
    ### BEGIN SOLUTION
    enable_apply(str(root), fx.apply_config())
    fallback = fx.definition_reference_run(make_definition())

    def attn(q, k, v, causal):
        return apply(fx.DEFINITION_NAME, args=(q, k, v, causal), fallback=fallback)

    return attn
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_routing", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
fx.check_deployment(deploy, workloads=("A", "B"))
print("each shape with traces went to its fastest PASSED solution")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_routing", deploy)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_fallback", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
fx.check_deployment(deploy, workloads=("C",))
print("the shape with no trace went to the fallback, and its output is right")
### BEGIN HIDDEN TESTS
from autograder.judge_client import judge  # grading only: the judge decides this test's points
judge("test_fallback", deploy)
### END HIDDEN TESTS
