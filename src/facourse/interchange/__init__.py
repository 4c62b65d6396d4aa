"""Step 11: one operator, interchangeable kernels — FlashInfer-Bench's definition, traces and apply().

FlashInfer-Bench (``flashinfer_bench``) describes an operator once, as a ``Definition`` (its axes,
its tensors, a PyTorch reference), and keeps any number of kernels for it as ``Solution``\\ s. A
``Workload`` is one concrete shape; a ``Trace`` records how one solution did on one workload
(PASSED or why not, its error, its time). ``enable_apply(root, config)`` reads a folder of these and
``apply(name, args=..., fallback=...)`` then sends each call to the fastest solution that PASSED on
the call's shape, or to the fallback when there is none.

The step's operator (the seed's spec, :data:`SPEC`): ``mini_flash_attention_prefill``, op_type
``gqa_ragged``, ``run(q, k, v, causal) -> out`` with

* ``q [batch, seq_q, num_heads, head_dim]``, ``k, v [batch, seq_kv, num_kv_heads, head_dim]``,
  float16; ``causal`` a scalar bool; ``out`` like q;
* batch, seq_q and seq_kv vary from call to call (var axes); num_heads = 32, num_kv_heads = 8 and
  head_dim = 128 are fixed (const axes).

Its layout ``[batch, seq, heads, dim]`` is the course's ``[B, H, S, D]`` transposed: a view, no copy
(:func:`to_course`, :func:`from_course`, :func:`definition_run`). The meaning is the course's
(``facourse.reference``): GQA (query head h reads KV head h // 4), causal aligned bottom-right, a row
that sees no key gives 0.

What this module gives the exercise and the grader:

* :func:`check_definition` and :func:`check_definition_reference`: a student's definition against
  the spec, and its reference against the course's one correctness rule;
* :func:`workloads` and :func:`make_workload_inputs`: the seed's shapes (and a CPU profile) as
  flashinfer_bench workloads, and their inputs drawn by ``facourse.configs.make_inputs``;
* :func:`trace`: one solution on one workload, checked by ``facourse.check.check_attention`` and timed
  by ``facourse.bench.bench_attention`` (on a GPU), as a flashinfer_bench ``Trace``;
* :func:`apply_config` and :func:`save_trace_set`: the tolerances and miss policy of a safe
  deployment, and a trace set on disk that ``enable_apply`` reads;
* :func:`routing_trace_set` and :func:`check_routing`: the grader's test of a deployment, from its
  outputs alone.

flashinfer_bench is imported inside the functions that need it, so that ``import facourse`` works
where it is not installed. The package's modules, one job each: ``spec`` (the operator as data, the
layouts), ``workloads``, ``definition`` (the definition's check), ``traces`` (tracing and its check),
``student`` (the exercises' kernels as solutions), ``deployment`` (apply()'s configuration, trace sets,
the routing check).
"""
from .definition import check_definition, check_definition_reference, definition_reference_run
from .deployment import (APPLY_MAX_ATOL, APPLY_MAX_RTOL, ROUTING_SOLUTIONS, apply_config, check_deployment,
                         check_routing, deployed, routing_solution, routing_tags, routing_trace, routing_trace_set,
                         routing_workloads, save_trace_set, served_by)
from .spec import (AXES, DEFINITION_NAME, HEAD_DIM, HKV, HQ, INPUTS, OP_TYPE, OUTPUTS, SPEC, TAG_INDEX,
                   InterchangeCheckError, as_definition, course_kernel, definition_run, from_course, load_fib,
                   python_solution, solution_source, spec_definition, to_course)
from .student import STUDENT_KERNELS, notebook_cells, student_solution, student_solutions
from .traces import as_json, check_traces, trace, trace_candidates
from .workloads import (CPU_WORKLOADS, PROFILES, ROUTING_WORKLOADS, TRACE_SHAPES, WORKLOADS, describe_workload,
                        make_workload_inputs, new_workload, workload_config, workload_names, workload_shape,
                        workloads)

