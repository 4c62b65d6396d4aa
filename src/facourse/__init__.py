"""facourse: the small library the FlashAttention course's notebooks import.

References, the one correctness check, the one benchmark, hardware guards, inputs.
"""
from .bench import BenchResult, bench_attention, sdpa_reference
from .check import (AttentionCheckError, CheckError, CheckReport, check_all, check_attention, check_entry_point,
                    nan_filled_allocations)
from .configs import (CONFIGS, CPU_CONFIGS, EDGE_CASES, LONG_CONFIG, AttnConfig, default_device,
                      get_config, make_inputs, profile, resolve_device, visible_pairs)
from .hw import HardwareUnavailable, gpu_or_skip, has_gpu, has_sm90a, require_gpu, require_sm90a
from . import rule  # the one correctness rule: guarded_call, compare, Mistake, diagnose
from .reference import (AttentionInputError, causal_mask, default_scale, kv_head_index,
                        reference_attention, torch_attention, validate_inputs)

__all__ = [name for name in dir() if not name.startswith("_")]
from .softmax_check import MERGE_CASES, SOFTMAX_CASES, SoftmaxCheckError, check_merge_fn, check_softmax_fn, reference_softmax  # noqa: E402 (steps 02-03)
from .visible import VISIBLE_CASES, check_visible  # noqa: E402 (the exercises' visible cells)
from .profiling import (OCCUPANCY_CASES, OCCUPANCY_GPU, ROOFLINE_CASES, ProfilingCheckError,  # noqa: E402 (step 13)
                        check_occupancy_fn, check_roofline_fn)
from .fa4 import EXP2_CASES, RESCALE_CASES, FA4CheckError, check_exp2_fn, check_rescale_fn  # noqa: E402 (step 14)
