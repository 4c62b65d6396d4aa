"""Exercise 13 (reading Nsight Compute: occupancy limits and the measured roofline) and its check, facourse.profiling.

Grading: the solution (every autograded point, the written answer left to the instructor) and the untouched stub
(0) through nbgrader (``GRADING``, the demo's samples, graded in tests/test_exercise_grading.py's one run); planted
bugs through the judge, each losing the test that names it while the others pass. The reference reproduces every
limit ncu reported in the committed run, and every classic mistake it names is caught by some case on any seed.
"""
from __future__ import annotations

import json
import math

import pytest

from conftest import assert_planted, planted_verdicts, solution_and_stub, solution_code
from autograder.scan import scan_source
from facourse import OCCUPANCY_GPU, ProfilingCheckError, check_occupancy_fn, check_roofline_fn
from facourse import profiling as P

A13 = "13_profiling"
GIVEN = ("imports",)
ANSWER = "Latency is hidden inside the block; v3 skips the masked tiles."   # a written answer

#: The demo's planted bug (carol): the SM's whole shared memory taken for the launch's carve-out.
PLANTED = ("occupancy", 'launch["launch__shared_mem_config_size"] //', "233472 //", "test_occupancy_records",
           "carve-out the SM is configured with")
GRADING = solution_and_stub(A13, 6, set(), 0, PLANTED, {"written_profiling": ANSWER})

OCC = ["test_occupancy_records", "test_occupancy_random", "test_occupancy_edges"]
ROOF = ["test_roofline_records", "test_roofline_random", "test_roofline_edges"]


def _mutate(code: str, old: str, new: str) -> str:
    assert old in code, f"planted bug out of date: {old!r} is not in the solution"
    return code.replace(old, new)


def test_planted_bugs_13(tmp_path):
    code = solution_code(A13)
    occ, roof = code["occupancy"], code["roofline_point"]
    bugs = {
        "max_smem": {"occupancy": _mutate(occ, *PLANTED[1:3])},
        "no_reserve": {"occupancy": _mutate(occ, '            + gpu["reserved_shared_memory_per_block"])', ")")},
        "warps_floor": {"occupancy": _mutate(occ, '-(-launch["launch__block_size"] // gpu["warp_size"])',
                                             'launch["launch__block_size"] // gpu["warp_size"]')},
        "one_register_file": {"occupancy": _mutate(occ, 'parts * (gpu["max_registers_per_multiprocessor"] // parts // per_warp)',
                                                   'gpu["max_registers_per_multiprocessor"] // per_warp')},
        "no_smem_rounding": {"occupancy": _mutate(occ, "(-(-smem // step) * step)", "smem")},
        "rate_as_bytes": {"roofline_point": _mutate(roof, '* seconds                     # a rate times the duration',
                                                    "")},
        "roof_max": {"roofline_point": _mutate(roof, "min(roofs", "max(roofs")},
        "zero_bytes": {"roofline_point": _mutate(roof, " if moved else math.inf", "")},
        # the H200's limits written into the function: right on every launch of the H200, wrong on other SMs
        "h200_numbers": {"occupancy": _mutate(occ, "    warps = -(-",
                                              f"    gpu = {dict(OCCUPANCY_GPU)!r}\n    warps = -(-")},
        "warps_plus_one": {"occupancy": _mutate(occ, '-(-launch["launch__block_size"] // gpu["warp_size"])',
                                                'launch["launch__block_size"] // gpu["warp_size"] + 1')},
        "no_static": {"occupancy": _mutate(occ, 'launch["launch__shared_mem_per_block_static"] + ', "")},
        "edges_table": {"occupancy": _table("occupancy", _occupancy_table())},
        "ns_as_us": {"roofline_point": _mutate(roof, '["gpu__time_duration.sum"] * 1e-9',
                                               '["gpu__time_duration.sum"] * 1e-6')},
        "gbps_as_bytes": {"roofline_point": _mutate(roof, 'roofs["gbps"] * 1e9 / 1e12', 'roofs["gbps"] / 1e12')},
        "flop_per_second": {"roofline_point": _mutate(roof, 'kernel["work"] / seconds / 1e12',
                                                      'kernel["work"] / seconds')},
        "work_doubled": {"roofline_point": _mutate(
            roof, "    seconds = ", '    kernel = {**kernel, "work": 2 * kernel["work"]}\n    seconds = ')},
        "bound_swapped": {"roofline_point": _mutate(roof, '"memory" if memory_roof < roofs["tflops"] else "compute"',
                                                    '"compute" if memory_roof < roofs["tflops"] else "memory"')},
        "no_traffic_zero": {"roofline_point": _mutate(roof, " if moved else math.inf", " if moved else 0.0")},
        "roof_edges_table": {"roofline_point": _table("roofline_point", _roofline_table())},
    }
    right = {   # correct answers written differently: every test passes
        # bytes = rate x ns x 1e-9 rounds otherwise than rate x (ns x 1e-9): the kernel at the ridge lands an ulp left
        "bytes_in_one_product": {"roofline_point": _mutate(
            roof, 'kernel["dram__bytes.sum.per_second"] * seconds',
            'kernel["dram__bytes.sum.per_second"] * kernel["gpu__time_duration.sum"] * 1e-9')},
        "ridge_inclusive": {"roofline_point": _mutate(roof, "memory_roof < roofs", "memory_roof <= roofs")},
    }
    expect = {   # bug: (the test it fails, what its message says, the tests it passes)
        "max_smem": ("test_occupancy_records", "carve-out the SM is configured with", ROOF),
        # a block without shared memory then costs nothing: the student's own division fails
        "no_reserve": ("test_occupancy_records", "still takes the reserved 1 KB", ROOF),
        # a block of fewer than 32 threads (random, edges) has 0 warps: the student's division raises, the check says why
        "warps_floor": ("test_occupancy_edges", "still takes a whole warp", ROOF + ["test_occupancy_records"]),
        "one_register_file": ("test_occupancy_random", "four files of 16384", ROOF + ["test_occupancy_records"]),
        "no_smem_rounding": ("test_occupancy_random", "128-byte steps", ROOF + ["test_occupancy_records"]),
        "rate_as_bytes": ("test_roofline_records", "is a rate", OCC),
        "roof_max": ("test_roofline_records", "the lower of the two", OCC),
        "zero_bytes": ("test_roofline_edges", "its intensity is math.inf", OCC + ["test_roofline_records",
                                                                            "test_roofline_random"]),
        "h200_numbers": ("test_occupancy_random", "not the H200's numbers", ROOF + ["test_occupancy_records",
                                                                                 "test_occupancy_edges"]),
        "warps_plus_one": ("test_occupancy_records", "a warp too many", ROOF),
        "no_static": ("test_occupancy_records", "launch__shared_mem_per_block_static was left out", ROOF),
        # a table of the committed launches and of the edges the grader lists: the edges are drawn from the seed
        "edges_table": ("test_occupancy_edges", "launches wrong", ROOF + ["test_occupancy_records"]),
        "ns_as_us": ("test_roofline_records", "x 1e-6 reads microseconds", OCC),
        "gbps_as_bytes": ("test_roofline_records", "roofs['gbps'] is in GB/s", OCC),
        "flop_per_second": ("test_roofline_records", "not FLOP/s", OCC),
        "work_doubled": ("test_roofline_records", "not twice", OCC),
        "bound_swapped": ("test_roofline_records", "are swapped", OCC),
        "no_traffic_zero": ("test_roofline_edges", "not 0: the compute roof", OCC + ["test_roofline_records",
                                                                                   "test_roofline_random"]),
        "roof_edges_table": ("test_roofline_edges", "kernels wrong", OCC + ["test_roofline_records"]),
    }
    got = planted_verdicts(tmp_path, A13, GIVEN, {**bugs, **right})
    assert_planted({b: got[b] for b in bugs}, expect)
    for name in right:
        wrong = {t: v["message"][:600] for t, v in got[name].items() if v["points"] != v["max"]}
        assert not wrong, f"{name} is right and lost points: {wrong}"


def _occupancy_table() -> dict:
    """ncu's limits of every committed launch and the reference's of the edges, on the seeds a student could try."""
    table = {repr(sorted(launch.items())): ncu for launch, ncu in P.record_launches()}
    for seed in range(4):
        for launch, *_ in P.occupancy_inputs("edges", seed):
            table[repr(sorted(launch.items()))] = P.occupancy_limits(launch)
    return table


def _roofline_table() -> dict:
    table = {}
    for case in ("records", "edges"):
        for seed in range(4):
            for k, r in zip(*P.roofline_inputs(case, seed)):
                table[repr(sorted(k.items())) + repr(sorted(r.items()))] = P.roofline_reference(k, r)
    return table


def _table(name: str, table: dict) -> str:
    """A cell that answers from ``table`` and guesses elsewhere: the answers written in, no formula."""
    args = "launch, gpu" if name == "occupancy" else "kernel, roofs"
    key = "repr(sorted(launch.items()))" if name == "occupancy" else \
        "repr(sorted(kernel.items())) + repr(sorted(roofs.items()))"
    guess = "(1, 1, 1, 32)" if name == "occupancy" else '(1.0, 1.0, 1.0, "memory", None)'
    return (f"inf = math.inf\nTABLE = {table!r}\n\n\ndef {name}({args}):\n"
            f"    return TABLE.get({key}, {guess})\n")


# ----------------------------------------------------------------------------- the check, in process
def _solution():
    scope = {"math": math}
    for cell in ("occupancy", "roofline_point"):
        exec(solution_code(A13)[cell], scope)   # noqa: S102
    return scope


def test_the_reference_reproduces_every_limit_ncu_reported():
    launches = P.record_launches()
    assert len(launches) >= 20
    for launch, ncu in launches:
        assert P.occupancy_limits(launch) == ncu, (launch, ncu)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_solution_passes_every_case(seed):
    sol = _solution()
    for case in P.OCCUPANCY_CASES:
        check_occupancy_fn(sol["occupancy"], case, seed=seed, verbose=False)
    for case in P.ROOFLINE_CASES:
        check_roofline_fn(sol["roofline_point"], case, seed=seed, verbose=False)


@pytest.mark.parametrize("bug", ["warps_floor", "warps_plus_one", "no_register_rounding", "no_warp_granularity",
                                 "threads_registers", "no_reserve", "no_static", "no_dynamic", "no_smem_rounding",
                                 "max_smem", "h200_numbers"])
def test_every_occupancy_mistake_is_caught_and_named_on_any_seed(bug):
    for seed in range(12):
        with pytest.raises(ProfilingCheckError) as err:
            check_occupancy_fn(lambda launch, gpu: P.occupancy_limits(launch, gpu, bug=bug), "random", seed=seed,
                               verbose=False)
        assert P.OCCUPANCY_MISTAKES[bug].split("{")[0][:30] in str(err.value), str(err.value)


@pytest.mark.parametrize("bug", ["rate_as_bytes", "roof_max", "executed", "useful_inverse", "ns_as_us", "ns_as_s",
                                 "gbps_as_bytes", "gbps_as_tbps", "flop_per_second", "roof_flops", "work_doubled",
                                 "useful_half", "bound_swapped"])
def test_every_roofline_mistake_is_caught_and_named_on_any_seed(bug):
    def other_side(k, r):               # the same mistake, its kernel at the ridge rounded to the compute side
        i, t, roof_t, bound, u = P.roofline_reference(k, r, bug=bug)
        at_ridge = math.isfinite(i) and abs(i * r["gbps"] / 1e3 - r["tflops"]) <= 1e-9 * r["tflops"]
        return i, t, roof_t, "compute" if at_ridge else bound, u

    for fn in (lambda k, r: P.roofline_reference(k, r, bug=bug), other_side):
        for case in ("records", "random", "edges"):
            for seed in range(12):
                with pytest.raises(ProfilingCheckError, match="likely cause") as err:
                    check_roofline_fn(fn, case, seed=seed, verbose=False)
                assert P.ROOFLINE_MISTAKES[bug][:40] in str(err.value), str(err.value)


def test_no_dram_traffic_read_as_zero_intensity_is_named():
    """Also where the student's bound at the ridge rounds to the other side than the reference's (seed 2)."""
    def zero(k, r):
        i, t, roof_t, bound, u = P.roofline_reference(k, r, bug="no_traffic_zero")
        return i, t, roof_t, "memory" if i * r["gbps"] / 1e3 <= r["tflops"] else "compute", u

    for fn in (lambda k, r: P.roofline_reference(k, r, bug="no_traffic_zero"), zero):
        for seed in (0, 1, 2, 1997915617):
            with pytest.raises(ProfilingCheckError) as err:
                check_roofline_fn(fn, "edges", seed=seed, verbose=False)
            assert P.ROOFLINE_MISTAKES["no_traffic_zero"][:40] in str(err.value), str(err.value)
            assert "on every kernel" not in str(err.value), str(err.value)


@pytest.mark.parametrize("seed", range(6))
def test_correct_answers_written_otherwise_pass(seed):
    """The same answers by other arithmetic: float rounding may put the kernel at the ridge an ulp to either side."""
    roof = _solution()["roofline_point"]

    def one_product(k, r):              # bytes = rate x ns x 1e-9: rounds otherwise than rate x (ns x 1e-9)
        i, t, roof_t, bound, u = roof(k, r)
        moved = k["dram__bytes.sum.per_second"] * k["gpu__time_duration.sum"] * 1e-9
        i = k["work"] / moved if moved else math.inf
        return i, t, min(r["tflops"], i * r["gbps"] / 1e3), "memory" if i * r["gbps"] / 1e3 < r["tflops"] else \
            "compute", u

    def ridge_first(k, r):              # the intensity against the ridge, both per second
        seconds = k["gpu__time_duration.sum"] / 1e9
        rate = k["dram__bytes.sum.per_second"]
        i = k["work"] / seconds / rate if rate else math.inf
        ridge = r["tflops"] * 1e12 / (r["gbps"] * 1e9)
        return (i, k["work"] / seconds / 1e12, r["tflops"] if i >= ridge else i * r["gbps"] * 1e9 / 1e12,
                "memory" if i < ridge else "compute", roof(k, r)[4])

    def ridge_inclusive(k, r):          # memory-bound up to the ridge included: the roofs meet there
        i, t, roof_t, bound, u = roof(k, r)
        return i, t, roof_t, "memory" if i * r["gbps"] / 1e3 <= r["tflops"] else "compute", u

    for fn in (one_product, ridge_first, ridge_inclusive):
        for case in P.ROOFLINE_CASES:
            check_roofline_fn(fn, case, seed=seed, verbose=False)


def test_a_launch_on_another_sm_is_shown_with_its_limits():
    occ = _solution()["occupancy"]

    def warps_64(launch, gpu):          # one of the H200's numbers written in
        return occ(launch, {**gpu, "max_warps_per_multiprocessor": 64})
    with pytest.raises(ProfilingCheckError) as err:
        check_occupancy_fn(warps_64, "random", seed=4, verbose=False)
    text = str(err.value)
    assert "max_warps_per_multiprocessor=" in text and "not the H200's numbers" in text, text


def test_wrong_answers_are_told_apart():
    sol = _solution()
    occ, roof = sol["occupancy"], sol["roofline_point"]

    def says(check, fn, case, text):
        with pytest.raises(ProfilingCheckError) as err:
            check(fn, case, seed=5, verbose=False)
        assert text in str(err.value), str(err.value)

    says(check_occupancy_fn, lambda launch, gpu: occ(launch, gpu)[:3], "records", "tuple of four")
    says(check_occupancy_fn, lambda launch, gpu: tuple(x + 0.5 for x in occ(launch, gpu)), "records", "whole number")
    says(check_occupancy_fn, lambda launch, gpu: (*occ(launch, gpu)[:3], 16), "edges", "the SM's own")

    def mutates(launch, gpu):
        gpu["warp_size"] = 64
        return occ(launch, {**gpu, "warp_size": 32})
    says(check_occupancy_fn, mutates, "records", "changed the dicts")
    says(check_roofline_fn, lambda k, r: roof(k, r)[:4], "records", "must return a tuple")
    says(check_roofline_fn, lambda k, r: (*roof(k, r)[:4], 0.0), "edges", "None where the tensor cores did nothing")
    says(check_roofline_fn, lambda k, r: (*roof(k, r)[:3], "memory", roof(k, r)[4]), "records", "'memory' or 'compute'")
    says(check_roofline_fn, lambda k, r: (*roof(k, r)[:3], roof(k, r)[3].title(), roof(k, r)[4]), "records",
         "it must be the string 'memory' or 'compute'")
    says(check_occupancy_fn, lambda launch, gpu: (*occ(launch, gpu)[:3], math.nan), "records", "whole number")

    def compute_below_ridge(k, r):             # compute-bound just left of the ridge too: the bound is wrong there
        i, t, roof_t, bound, u = roof(k, r)
        return i, t, roof_t, "memory" if i * r["gbps"] / 1e3 < 0.5 * r["tflops"] else "compute", u
    says(check_roofline_fn, compute_below_ridge, "random", "(bound)")


def test_numpy_scalars_are_plain_numbers_in_the_judge():
    """Limits computed with NumPy (np.int64) are the whole numbers they stand for, there and in the judge."""
    import numpy as np
    from autograder.wire import decode, encode
    blobs = []
    assert decode(encode((np.int64(3), np.float32(2.5), np.int32(0)), blobs), blobs) == (3, 2.5, 0)
    occ = _solution()["occupancy"]
    check_occupancy_fn(lambda launch, gpu: tuple(np.int64(x) for x in occ(launch, gpu)), "records", seed=5,
                       verbose=False)


def test_a_lookup_of_the_committed_answers_fails_the_hidden_cases():
    """A student who reads the committed run could return ncu's own limits by matching the launch: that passes
    "records" and nothing else."""
    table = {tuple(sorted(launch.items())): ncu for launch, ncu in P.record_launches()}

    def lookup(launch, gpu):
        return table.get(tuple(sorted(launch.items())), (0, 0, 0, 0))

    check_occupancy_fn(lookup, "records", seed=1, verbose=False)
    for case in ("random", "edges"):
        with pytest.raises(ProfilingCheckError):
            check_occupancy_fn(lookup, case, seed=1, verbose=False)


def test_the_edges_are_drawn_from_the_seed():
    """The edges the grader lists, answered from a table made on other seeds, fail: no case is the same for all."""
    occ = {repr(sorted(launch.items())): P.occupancy_limits(launch)
           for seed in range(3) for launch, *_ in P.occupancy_inputs("edges", seed)}
    roof = {repr((sorted(k.items()), sorted(r.items()))): P.roofline_reference(k, r)
            for seed in range(3) for k, r in zip(*P.roofline_inputs("edges", seed))}
    with pytest.raises(ProfilingCheckError):
        check_occupancy_fn(lambda launch, gpu: occ.get(repr(sorted(launch.items())), (0, 0, 0, 0)), "edges", seed=7,
                           verbose=False)
    with pytest.raises(ProfilingCheckError):
        check_roofline_fn(lambda k, r: roof.get(repr((sorted(k.items()), sorted(r.items()))),
                                                (1.0, 1.0, 1.0, "memory", None)), "edges", seed=7, verbose=False)


def test_the_scan_flags_a_call_of_the_references():
    for src in ("from facourse.profiling import occupancy_limits\noccupancy = occupancy_limits\n",
                "import facourse.profiling as p\ndef roofline_point(k, r):\n    return p.roofline_reference(k, r)\n",
                "from facourse.fa4 import lazy_step\n",                          # step 14's reference too
                # looked up by a name the line never spells
                "import facourse.profiling as p\noccupancy = getattr(p, 'occupancy' '_limits')\n",
                "import facourse.profiling as p\noccupancy = p.__dict__['occupancy' + '_limits']\n",
                "import facourse.fa4 as F\nstep = vars(F)[''.join(['lazy', '_step'])]\n"):
        assert any("the course's own reference" in f.rule for f in scan_source(src, "cell occupancy")), src
    frame = "import sys\ndef occupancy(l, g):\n    return sys._getframe(1).f_globals['x'](l, g)\n"
    assert any("a lookup by name" in f.rule for f in scan_source(frame, "cell occupancy"))
    assert not scan_source(solution_code(A13)["occupancy"], "cell occupancy")


def test_the_gpu_limits_are_the_committed_devices():
    """OCCUPANCY_GPU's limits are the device attributes ncu recorded with the committed run."""
    dev = P.load_run()["device"]
    for k, v in OCCUPANCY_GPU.items():
        if k in dev:
            assert dev[k] == v, (k, dev[k], v)


# ----------------------------------------------------------------------------- the runner that measured the data
def test_the_profile_runners_targets_are_the_course_rungs_and_its_csv_parses():
    from benchmarks import counters as profile
    from facourse.steps import load_step, rung
    for name, (step, what, config) in profile.TARGETS.items():
        if step not in ("cal", "sdpa", "01"):
            rung(load_step(step), what)                     # raises when the manifest has no such rung
    csv = ('"ID","Kernel Name","launch__block_size","gpu__time_duration.sum","dram__bytes.sum.per_second"\n'
           '"","","","ns","byte/s"\n"0","attn_fwd","128","1,001,056","3.5e+11"\n')
    (k,) = profile.parse_raw("==PROF== noise\n" + csv)
    assert k["Kernel Name"] == "attn_fwd" and k["launch__block_size"] == 128
    assert k["gpu__time_duration.sum"] == 1001056 and k["dram__bytes.sum.per_second"] == 3.5e11
    assert k["_units"]["gpu__time_duration.sum"] == "ns"
    assert profile.KEEP.match("launch__occupancy_limit_registers") and not profile.KEEP.match("device__attribute_x")


def test_the_proton_summary_reads_the_hatchet_trees(tmp_path):
    from benchmarks import counters
    kernel = {"frame": {"name": "attn_fwd"}, "metrics": {"count": 10, "time (ns)": 6103668}, "children": []}
    ladder = [{"frame": {"name": "ROOT"}, "metrics": {}, "children": [
        {"frame": {"name": "05_v6"}, "metrics": {"flops": 2.75e12}, "children": [kernel]}]}]
    sampled = [{"frame": {"name": "ROOT"}, "metrics": {}, "children": [{"frame": {"name": "05_v6"}, "metrics": {},
               "children": [{"frame": {"name": "attn_fwd"}, "children": [], "metrics": {
                   "num_samples": 100, "num_stalled_samples": 60, "stalled_barrier": 40, "stalled_wait": 0}}]}]}]
    (tmp_path / "proton_ladder.hatchet").write_text(json.dumps(ladder))
    (tmp_path / "proton_pcsampling_05_v6.hatchet").write_text(json.dumps(sampled))
    d = counters.proton_summary(tmp_path, 10)
    assert d["targets"] == [{"target": "05_v6", "flops": 2.75e12,
                             "kernels": [{"name": "attn_fwd", "count": 10, "time_ns": 6103668}]}]
    assert d["pc_sampling"] == {"05_v6": {"kernel": "attn_fwd", "samples": 100, "stalled": 60,
                                          "by_reason": {"barrier": 40}}}


def test_an_error_of_the_function_is_told_with_its_input_and_cause():
    def stub(launch, gpu):
        raise NotImplementedError
    with pytest.raises(ProfilingCheckError, match="not written yet") as err:
        check_occupancy_fn(stub, "records", seed=0, verbose=False)
    assert "launch__block_size=" in str(err.value)
    with pytest.raises(ProfilingCheckError, match="intensity is math.inf"):
        check_roofline_fn(lambda k, r: k["work"] / (k["dram__bytes.sum.per_second"] * k["gpu__time_duration.sum"]),
                          "edges", seed=0, verbose=False)


def test_a_division_by_zero_is_blamed_on_the_counter_that_is_zero():
    roof, occ = _solution()["roofline_point"], _solution()["occupancy"]

    def unguarded_useful(k, r):        # work / 0 on a kernel without tensor-core work, whose DRAM traffic is not 0
        return (*roof(k, r)[:4], k["work"] / k["sm__ops_path_tensor_src_fp16.sum"])
    with pytest.raises(ProfilingCheckError) as err:
        check_roofline_fn(unguarded_useful, "records", seed=0, verbose=False)
    assert "useful is None, not work / 0" in str(err.value) and "no DRAM bytes" not in str(err.value), str(err.value)

    def no_dynamic(launch, gpu):       # sm_75 reserves nothing: a block of dynamic shared memory alone divides by 0
        return occ({**launch, "launch__shared_mem_per_block_dynamic": 0}, gpu)
    with pytest.raises(ProfilingCheckError) as err:
        check_occupancy_fn(no_dynamic, "random", seed=0, verbose=False)
    assert "count both" in str(err.value) and "reserved 1 KB" not in str(err.value), str(err.value)


def test_answers_one_factor_off_say_so():
    roof = _solution()["roofline_point"]
    with pytest.raises(ProfilingCheckError) as err:     # intensity of half the work, the rest right
        check_roofline_fn(lambda k, r: (roof(k, r)[0] / 2, *roof(k, r)[1:]), "records", seed=0, verbose=False)
    assert "intensity is 0.5 x the expected on every kernel" in str(err.value), str(err.value)


def test_mistakes_the_inputs_cannot_tell_apart_are_both_named():
    """On the committed launches (whole warps) registers x threads and unrounded registers give the same limits."""
    with pytest.raises(ProfilingCheckError) as err:
        check_occupancy_fn(lambda launch, gpu: P.occupancy_limits(launch, gpu, bug="threads_registers"), "records",
                           seed=0, verbose=False)
    for bug in ("threads_registers", "no_register_rounding"):
        assert P.OCCUPANCY_MISTAKES[bug][:40] in str(err.value), str(err.value)
