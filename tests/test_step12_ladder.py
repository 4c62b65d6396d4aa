"""Step 12's ladder: the rungs of solutions/12_ring_attention/ladder on CPU ranks (gloo), its manifest,
and benchmarks/ladder.py's ring mode on the CPU (--cpu-smoke: spawn, group, timing, the results file).

* Every rung against facourse.ring.check_ring (the course's check of the gathered rows; for the rings
  also the traffic: K and V point to point) on the layout the manifest names: the solution on every
  case of RING_CASES in float32, and in float16 and bfloat16 on one case each; the other rungs on 4
  ranks causal (with a scale of 0.3), 3 ranks causal (ragged, uneven shards, an odd ring: v2's parity
  order must still drain), 3 ranks non-causal (ragged), MQA in bfloat16, and two rings at once over
  subgroups of a world of 4; the solution also on one ring over part of the world (the others idle).
* The solution and v1 with the GPU's block kernel (step 05's Triton solution, in the interpreter).
* A deadlocked ring (v2 with every rank sending first; alone, and as two rings over subgroups) is stopped by
  its time limit (RingError), naming the line where each rank waits; a slow one (ranks still using the
  CPU) runs on; a world that never formed its group (rank 0 held in dist.init_process_group) starts once
  more.
"""
from __future__ import annotations

import json
import sys
import time

import pytest
import torch

from conftest import load_module
from facourse.ring import RING_CASES, LAYOUTS, RingError, check_ring
from facourse.steps import load_step, rung

M = load_step("12")
LADDER = M["ladder_dir"]
SOLUTION = M["ladder"]["solution"]
OTHERS = [r["name"] for r in M["rungs"] if r["name"] != SOLUTION]
ALLGATHER = "v1_allgather"                      # the one rung that gathers K/V instead of passing it on
OTHER_CASES = [("w4_causal", "float32", 0.3), ("w3_ragged", "float32", None),
               ("w3_ragged_noncausal", "float32", None), ("w2_mqa", "bfloat16", None),
               ("w4_two_rings", "float32", None)]
sys.path.insert(0, str(LADDER))                # the rungs import ring_common from their folder
CHECKS = ([(SOLUTION, c, "float32", 0.3 if c == "w4_causal" else None) for c in RING_CASES]
          + [(SOLUTION, "w2_causal", "float16", None), (SOLUTION, "w3_ragged", "bfloat16", None)]
          + [(n, *case) for n in OTHERS for case in OTHER_CASES])


def _rung(name):
    return load_module(LADDER / rung(M, name)["file"], f"ladder12_{name}")


@pytest.mark.parametrize("name,case,dtype,scale", CHECKS)
def test_rung_passes_check_ring(name, case, dtype, scale):
    """The rows, and for the rings the traffic: K/V point to point, only the lengths through a collective."""
    check_ring(_rung(name).ring_attention, case, dtype=getattr(torch, dtype), layout=rung(M, name).get("layout"),
               scale=scale, traffic=name != ALLGATHER, verbose=False)


def test_a_ring_over_part_of_the_world():
    """One ring over ranks {1, 3} of a world of 4: ranks 0 and 2 take no part and return None at once,
    and the ring's every operation ran on its group, between its two ranks."""
    from dataclasses import replace

    from facourse.ring import RingCase, get_ring_case
    case = RingCase("w4_ring_13", replace(get_ring_case("w4_two_rings").cfg, B=1), 4, ((1, 3),))
    run = check_ring(_rung(SOLUTION).ring_attention, case, traffic=True, verbose=False)
    assert run.results[0] is None and run.results[2] is None and run.traffic[0] == run.traffic[2] == {}
    assert run.outside_ops() == [0, 0, 0, 0] and run.off_ring_bytes() == [0, 0, 0, 0] and run.p2p_bytes()[1] > 0


@pytest.mark.parametrize("name,case", [(SOLUTION, "w2_causal"), (ALLGATHER, "w3_ragged")])
def test_rings_with_the_gpu_block_kernel(name, case, monkeypatch):
    """The block kernel a GPU rank uses (step 05's Triton solution, here in the interpreter) in the rings:
    bottom-right causal with Sq != Skv (v1's chunk against its prefix), blocks that are views of a shard."""
    import ring_common
    monkeypatch.setattr(ring_common, "block_kernel", lambda device: ring_common._step05_kernel())
    check_ring(_rung(name).ring_attention, case, dtype=torch.float16, verbose=False)


@pytest.mark.parametrize("case", ["w2_causal", "w4_two_rings"])
def test_blocking_ring_without_an_order_is_stopped(monkeypatch, case):
    """v2 with every rank sending first: no rank reaches its receive; check_ring's limit stops it (two
    rings over subgroups too: every rank of the world named)."""
    import torch.distributed as dist
    v2 = _rung("v2_ring_blocking")

    def every_rank_sends_first(ring, k, v, rows):
        k_in, v_in = (t.new_empty(*t.shape[:2], rows, t.shape[3]) for t in (k, v))
        dist.send(k, ring.next, group=ring.group)
        dist.send(v, ring.next, group=ring.group)
        dist.recv(k_in, ring.prev, group=ring.group)
        dist.recv(v_in, ring.prev, group=ring.group)
        return k_in, v_in

    monkeypatch.setattr(v2, "pass_on", every_rank_sends_first)
    t0 = time.monotonic()
    with pytest.raises(RingError, match="had not returned after 3 s") as err:
        check_ring(v2.ring_attention, case, layout="contiguous", timeout=3, verbose=False)
    assert time.monotonic() - t0 < 20
    line = every_rank_sends_first.__code__.co_firstlineno + 2       # its first dist.send
    assert f"where: rank 0 in send, from line {line} of every_rank_sends_first; rank 1 in send" in str(err.value)
    assert all(f"rank {r} in send" in str(err.value) for r in range(RING_CASES[case].world))


def _spinning(seconds, then=None):
    """A ring whose ranks first use the CPU for ``seconds`` (a loaded machine, slow code), then run ``then``."""
    def ring_attention(q, k, v, causal=False, scale=None, group=None):
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            pass
        return then(q, k, v, causal=causal, scale=scale, group=group)
    return ring_attention


def test_a_slow_world_is_not_a_stuck_one(monkeypatch):
    """Past its time limit a world whose ranks still use the CPU goes on (a loaded machine is slow, not
    deadlocked), from an allowance of seconds per process; once that is spent, a world still spinning
    stops, and the cause named is the work."""
    from facourse import ring_ranks as ring
    monkeypatch.setattr(ring, "EXTRA_SECONDS", 3.0)
    monkeypatch.setattr(ring, "_extra_spent", 0.0)
    check_ring(_spinning(2.0, _rung(SOLUTION).ring_attention), "w2_causal", timeout=1, verbose=False)
    for most in (3.0, 1.0):                     # the rest of the allowance, then none
        t0 = time.monotonic()
        with pytest.raises(RingError, match=r"had not returned after \d+ s \(still busy after 1 s\)") as err:
            check_ring(_spinning(3600), "w2_causal", timeout=1, verbose=False)
        assert 1.0 <= time.monotonic() - t0 < 1.0 + most + 8
        assert "likely cause: ranks still computing" in str(err.value) and "rank 0 in ring_attention" in str(err.value)
    assert ring._extra_spent >= ring.EXTRA_SECONDS


def _slow_to_join(monkeypatch, tmp_path, times: int):
    """Rank 0 of the first ``times`` worlds hangs in dist.init_process_group (as the forked ranks call
    it), so that no rank of those worlds joins its group; each world's rank 0 leaves a file."""
    import torch.distributed as dist
    real = dist.init_process_group

    def init(*args, **kwargs):
        if kwargs["rank"] == 0:
            started = len(list(tmp_path.glob("world*")))
            (tmp_path / f"world{started}").touch()
            if started < times:
                time.sleep(3600)
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", init)


def test_a_world_that_does_not_form_is_started_again(monkeypatch, tmp_path):
    """Ranks that had not joined their group at the time limit ran nothing of the ring: the machine
    failed, so the world starts once more, and a correct ring passes."""
    _slow_to_join(monkeypatch, tmp_path, times=1)
    check_ring(_rung(SOLUTION).ring_attention, "w2_causal", timeout=3, verbose=False)
    assert len(list(tmp_path.glob("world*"))) == 2


def test_a_world_that_never_forms_blames_the_machine(monkeypatch, tmp_path):
    _slow_to_join(monkeypatch, tmp_path, times=2)
    with pytest.raises(RingError, match=r"rank\(s\) \[0, 1\] of 2 had not joined the process group after 3 s: "
                                        r"the machine .* not the ring \(started 2 times\)"):
        check_ring(_rung(SOLUTION).ring_attention, "w2_causal", timeout=3, verbose=False)


def test_manifest_matches_the_ladder():
    assert M["step"]["id"] == "12" and M["step"]["title"] and M["exercise"]["mode"] == "ring"
    assert M["entry_points"] == ["ring_attention"] and M["exercise"]["harness"] == []
    assert M["reference"]["backend"] == "ONE_GPU"
    from facourse.kinds.ring import CONFIGS
    assert M["reference"]["graded_configs"] == list(CONFIGS)
    names = [r["name"] for r in M["rungs"]]
    assert names == ["v1_allgather", "v2_ring_blocking", "v3_ring_overlap", "v4_zigzag"] and SOLUTION in names
    listed = {r["file"] for r in M["rungs"]} | set(M["ladder"]["support"])
    assert {p.name for p in LADDER.iterdir() if p.is_file() and not p.name.startswith(".")} == listed
    for r in M["rungs"]:
        assert r["verdict"].strip() and "\n" not in r["verdict"], r["name"]
        assert r.get("layout", "contiguous") in LAYOUTS, r["name"]
        head = (LADDER / r["file"]).read_text().split('"""')[1]
        assert f"{r['name'].split('_')[0]} verdict:" in head, f"{r['file']}: its header states no verdict"
        assert hasattr(_rung(r["name"]), "ring_attention")
    assert "layout" not in rung(M, SOLUTION), "the solution shards by the rule (zigzag when causal)"


def test_ring_mode_needs_two_gpus(tmp_path, capsys):
    from benchmarks.ladder import main
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2 GPUs")
    assert main(["12", "--out", str(tmp_path)]) == 2
    assert "runs on 2 GPUs" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


def test_ring_mode_cpu_smoke_writes_the_schema(tmp_path, capsys, monkeypatch):
    """The ring mode end to end on 2 CPU ranks: spawn, group, checks, timing, the probe, the transfer
    alone, the one-device reference, the results file and the table."""
    from benchmarks.ladder import main
    from facourse import results
    from facourse.kinds.ring import ENV
    for k in ENV:                          # the runner sets them for its ranks: restored after the test
        monkeypatch.setenv(k, "")
    assert main(["12", "--cpu-smoke", "--only", SOLUTION, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (f,) = tmp_path.glob("*_cpu_step12.json")
    d = json.loads(f.read_text())
    assert {"schema", "step", "env", "timing", "reference", "mode", "world", "one_gpu", "solution", "rungs",
            "rows"} <= set(d)
    assert d["schema"] == 1 and d["step"] == "12" and d["mode"] == "ring" and d["world"] == 2
    assert d["reference"] == M["reference"]["backend"] and d["solution"] == SOLUTION
    assert set(d["env"]) >= {"gpu", "date", "torch", "triton", "cuda", "cudnn", "capability", "sm_count"}
    assert "error" not in d["rungs"][SOLUTION], d["rungs"][SOLUTION]
    checks = [x for x in d["rows"] if x["kind"] == "check"]
    assert {x["config"] for x in checks} == {c for c, rc in RING_CASES.items() if rc.world == 2}
    assert all(x["check"] == "ok" for x in checks), checks
    bench = [x for x in d["rows"] if x["kind"] == "bench"]
    assert [x["config"] for x in bench] == list(d["one_gpu"]) == ["smoke_causal_256", "smoke_causal_512"]
    for x in bench:
        assert x["ref_backend"] == "ONE_GPU" and x["ms"] > 0 and x["ms_ref"] > 0 and x["tflops_ref"] >= 0
        # stored to 4 places (facourse.kinds.ring): a CPU smoke ratio near 0.04 is off by up to 5e-5 from rounding
        assert x["ratio"] == pytest.approx(x["ms_ref"] / x["ms"], rel=1e-3, abs=5e-5)
        # both rounded to 4 places: efficiency by up to 5e-5, ratio / 2 by up to 2.5e-5
        assert x["efficiency"] == pytest.approx(x["ratio"] / 2, rel=1e-3, abs=7.5e-5 + 1e-9)
        assert len(x["rank_ms"]) == len(x["compute_ms"]) == len(x["wait_ms"]) == 2 and x["transfer_ms"] > 0
        # v4 on 2 ranks: two ring steps, a wait for the shard after the first
        assert [len(s) for s in x["step_compute_ms"]] == [2, 2] and [len(s) for s in x["step_wait_ms"]] == [1, 1]
        assert x["ms"] >= max(x["rank_ms"]) - 1e-3      # each call's step time is its slower rank's
    assert "checks 3/3" in out and "smoke_causal_512" in out.split("checks 3/3")[1]
    table = results.ring_table(results.compact(d, f.name))
    assert table.count("\n") == 3 and f"| {SOLUTION} | 3/3 | smoke_causal_256 |" in table
