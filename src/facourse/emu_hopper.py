"""Step 07's CPU check (``facourse.cuda_host_check``), its ring: the problems one emulated CTA runs
(``emu/driver_hopper.cpp``), the schedule of the K/V ring (the one place the check knows it), the runs
of the whole kernel with either side replaced by an oracle, and the producer's check.

``producer``: the student's producer with oracle consumers that wait, check what landed in each slot
and release, on two problems (GQA, causal with row blocks of no key, ragged lengths, D = 64 and 128,
the ring wrapping many times); its calls are compared with the schedule: which tiles, which key blocks
in which order, coordinates, slots, barriers, bytes announced, the waits for empty slots and their
parities.
"""
from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .emu_build import FunctionResult, run_driver_full

__all__ = ["ARRIVE", "BARS", "CONSUMER_PROBLEMS", "EMPTY_BARS", "EXPECT", "H_ROWS", "KernelRun", "LN2", "LOG2E",
           "MAPS", "PRODUCER_PROBLEMS", "Problem", "REGIONS", "TMA", "VERIFY", "WAIT", "check_producer", "deadlock",
           "from_bits", "inputs", "round_to", "run_kernel", "schedule", "tiles", "to_bits"]

# The kernel's constants (hopper_common.cuh): BLOCK_M = BLOCK_N = 128 rows, STAGES = 2, panels of 64 columns.
H_ROWS, H_STAGES, H_PANEL = 128, 2, 64
WAIT, EXPECT, TMA, ARRIVE, VERIFY = 1, 2, 3, 4, 5          # the driver's operation and event kinds
BARS = ("q_full", "q_empty", "k_full[0]", "k_full[1]", "k_empty[0]", "k_empty[1]", "v_full[0]", "v_full[1]",
        "v_empty[0]", "v_empty[1]", "tile_full[0]", "tile_full[1]", "tile_empty[0]", "tile_empty[1]",
        "q2_full", "q2_empty")          # the last two: the ladder's second Q slot (HFA_OVERLAP_TILES)
_BAR_BASE = {"q_full": 0, "q_empty": 1, "k_full": 2, "k_empty": 4, "v_full": 6, "v_empty": 8}
EMPTY_BARS = {1, 4, 5, 8, 9, 12, 13, 15}                  # their phases count 8 arrivals (one per consumer warp)
REGIONS = ("Q", "K slot 0", "V slot 0", "K slot 1", "V slot 1")   # the driver's order of the slots
MAPS = ("Q", "K", "V")
LOG2E, LN2 = math.log2(math.e), math.log(2.0)


def _bar(kind: str, s: int = 0) -> int:
    return _BAR_BASE[kind] + (s if kind[0] in "kv" else 0)


@dataclass(frozen=True)
class Problem:
    """One attention problem the emulated CTA runs (gridDim 1: the persistent CTA takes every tile)."""
    name: str
    D: int
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Skv: int
    causal: bool
    bf16: bool = False
    seed: int = 0
    amp: float = 1.0          # the scale of q and k (large logits move the running max)

    @property
    def scale(self) -> float:
        return 1 / math.sqrt(self.D)

    def layout(self) -> dict[str, int]:
        q = H_ROWS * self.D * 2
        return {"Q": 0, "Q_bytes": q, "K": q, "KV_bytes": q, "V": q + H_STAGES * q}

    def text(self) -> str:
        return (f"{'bf16' if self.bf16 else 'fp16'}, D = {self.D}, B = {self.B}, Hq = {self.Hq}, Hkv = {self.Hkv}, "
                f"Sq = {self.Sq}, Skv = {self.Skv}, {'causal' if self.causal else 'not causal'}")


PRODUCER_PROBLEMS = (
    Problem("gqa_causal", D=128, B=1, Hq=4, Hkv=2, Sq=200, Skv=328, causal=True, seed=71),
    Problem("empty_tiles", D=64, B=2, Hq=2, Hkv=1, Sq=300, Skv=100, causal=True, seed=72),
)
CONSUMER_PROBLEMS = (
    Problem("diagonal", D=128, B=1, Hq=2, Hkv=1, Sq=200, Skv=360, causal=True, seed=73, amp=1.5),
    Problem("empty_rows", D=64, B=2, Hq=2, Hkv=1, Sq=300, Skv=100, causal=True, seed=74),
    Problem("five_blocks_bf16", D=128, B=1, Hq=1, Hkv=1, Sq=100, Skv=520, causal=False, bf16=True, seed=75, amp=2.0),
)


def _num_kv_blocks(P: Problem, m_block: int) -> int:
    n = -(-P.Skv // H_ROWS)
    if P.causal:
        last_key = min(m_block * H_ROWS + H_ROWS, P.Sq) - 1 + P.Skv - P.Sq
        n = 0 if last_key < 0 else min(n, last_key // H_ROWS + 1)
    return n


def tiles(P: Problem) -> list[tuple[int, int, int, int, int]]:
    """(tile number, m_block, h, b, nb) in the scheduler's order (hopper_common.cuh's TileScheduler)."""
    m_blocks = -(-P.Sq // H_ROWS)
    out = []
    for t in range(m_blocks * P.Hq * P.B):
        bh = t // m_blocks
        mb = m_blocks - 1 - t % m_blocks
        out.append((t, mb, bh % P.Hq, bh // P.Hq, _num_kv_blocks(P, mb)))
    return out


def schedule(P: Problem, *, gqa="div", left_to_right=False, all_blocks=False, skip_empty=True, block_coords=False,
              reset_it=False, first_panel_only=False, panel_coords=False):
    """What the producer does, tile by tile (the one place this check knows it): operations (tile, kind,
    bar, arg, map, dst, c0, c1, c2, c3) for the oracle producer and to compare a producer with; the
    consumers' side of the ring for the oracle consumers (waits, checks of what landed, releases, in the
    solution's order); and, per TMA, what it loads. Keywords switch one classic mistake on."""
    lay = P.layout()
    panels = 1 if first_panel_only else P.D // H_PANEL
    group = P.Hq // P.Hkv
    pops, cops, what = [], [], []
    it = q_round = 0
    for t, mb, h, b, nb in tiles(P):
        if all_blocks:
            nb = -(-P.Skv // H_ROWS)
        if nb == 0 and skip_empty:
            continue
        if reset_it:
            it = 0
        hk = {"div": h // group, "same": h, "mod": h % P.Hkv}[gqa]

        def row(block):
            return block if block_coords else block * H_ROWS

        def col(c):
            return c if panel_coords else c * H_PANEL

        tile = dict(t=t, m_block=mb, h=h, b=b, nb=nb)
        if q_round > 0:
            pops.append((t, WAIT, _bar("q_empty"), (q_round - 1) & 1, 0, 0, 0, 0, 0, 0))
        pops.append((t, EXPECT, _bar("q_full"), lay["Q_bytes"], 0, 0, 0, 0, 0, 0))
        for c in range(panels):
            pops.append((t, TMA, _bar("q_full"), 0, 0, lay["Q"] + c * H_ROWS * 128, col(c), row(mb), h, b))
            what.append(dict(tile, map="Q", panel=c, q_round=q_round))
        blocks = list(range(nb)) if left_to_right else list(range(nb - 1, -1, -1))
        ring = []
        for j in blocks:
            s, ph = it % H_STAGES, (it // H_STAGES) & 1
            for kind, m in (("k", 1), ("v", 2)):
                pops.append((t, WAIT, _bar(kind + "_empty", s), ph ^ 1, 0, 0, 0, 0, 0, 0))
                pops.append((t, EXPECT, _bar(kind + "_full", s), lay["KV_bytes"], 0, 0, 0, 0, 0, 0))
                for c in range(panels):
                    pops.append((t, TMA, _bar(kind + "_full", s), 0, m, lay[kind.upper()] + s * lay["KV_bytes"]
                                 + c * H_ROWS * 128, col(c), row(j), hk, b))
                    what.append(dict(tile, map=kind.upper(), panel=c, j=j, it=it, slot=s, hk=hk))
            ring.append((it, j))
            it += 1
        if nb > 0:
            cops.append((t, WAIT, _bar("q_full"), q_round & 1, 0, 0, 0, 0, 0, 0))
            cops.append((t, VERIFY, 0, 0, 0, lay["Q"], 0, mb * H_ROWS, h, b))

            def take(i, kind):
                pos, j = ring[i]
                s = pos % H_STAGES
                cops.append((t, WAIT, _bar(kind + "_full", s), (pos // H_STAGES) & 1, 0, 0, 0, 0, 0, 0))
                cops.append((t, VERIFY, 0, 0, 1 if kind == "k" else 2, lay[kind.upper()] + s * lay["KV_bytes"], 0,
                             j * H_ROWS, hk, b))

            def give(i, kind):
                cops.append((t, ARRIVE, _bar(kind + "_empty", ring[i][0] % H_STAGES), 0, 0, 0, 0, 0, 0, 0))

            take(0, "k")
            give(0, "k")
            for i in range(1, len(ring)):
                take(i, "k")
                take(i - 1, "v")
                give(i, "k")
                give(i - 1, "v")
            cops.append((t, ARRIVE, _bar("q_empty"), 0, 0, 0, 0, 0, 0, 0))
            take(len(ring) - 1, "v")
            give(len(ring) - 1, "v")
        q_round += 1
    return pops, cops, what


# ----------------------------------------------------------------------------- inputs, runs
def to_bits(x, bf16: bool) -> np.ndarray:
    if not bf16:
        return np.asarray(x, np.float16).view(np.uint16)
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def from_bits(bits, bf16: bool) -> np.ndarray:
    bits = np.asarray(bits, np.uint16)
    if not bf16:
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def round_to(x, bf16: bool) -> np.ndarray:
    return from_bits(to_bits(x, bf16), bf16)


def inputs(P: Problem):
    """q, k, v of a problem as ([B, H, S, D] bit patterns, the same as float64)."""
    rng = np.random.default_rng(P.seed)
    out = []
    for shape, amp in (((P.B, P.Hq, P.Sq, P.D), P.amp), ((P.B, P.Hkv, P.Skv, P.D), P.amp), ((P.B, P.Hkv, P.Skv, P.D), 1.0)):
        bits = to_bits(rng.standard_normal(shape) * amp, P.bf16)
        out.append((bits, from_bits(bits, P.bf16)))
    return out


@dataclass
class KernelRun:
    ok: bool
    message: str                  # the emulation's failure (empty when ok)
    trace: np.ndarray             # [n, 11]: kind, bar, arg, map, dst, c0, c1, c2, c3, phase, returned
    stats: dict
    o: np.ndarray | None = None
    lse: np.ndarray | None = None


def run_kernel(binary: Path, P: Problem, *, oracle_producer: bool, oracle_consumer: bool) -> KernelRun:
    (qb, _), (kb, _), (vb, _) = inputs(P)
    pops, cops, _ = schedule(P)
    pops = pops if oracle_producer else []
    cops = cops if oracle_consumer else []
    data = (np.array([len(pops), len(cops)], np.int64).tobytes() + np.float32(P.scale).tobytes() + qb.tobytes()
            + kb.tobytes() + vb.tobytes() + np.array(pops, np.int64).reshape(-1, 10).tobytes()
            + np.array(cops, np.int64).reshape(-1, 10).tobytes())
    args = ["kernel", int(P.bf16), P.D, P.B, P.Hq, P.Hkv, P.Sq, P.Skv, int(P.causal), int(oracle_producer),
            int(oracle_consumer)]
    rc, out, msg = run_driver_full(binary, args, data, timeout=40)
    trace, stats = np.zeros((0, 11), np.int64), {}
    if len(out) >= 32:
        n, gemms, waits, arrives = np.frombuffer(out[:32], np.int64)
        stats = dict(gemms=int(gemms), waits=int(waits), arrives=int(arrives))
        trace = np.frombuffer(out[32:32 + 88 * int(n)], np.int64).reshape(-1, 11)
        out = out[32 + 88 * int(n):]
    if rc != 0:
        return KernelRun(False, msg or "it ended without a result", trace, stats)
    n_o = P.B * P.Hq * P.Sq * P.D
    o = from_bits(np.frombuffer(out[:2 * n_o], np.uint16), P.bf16).reshape(P.B, P.Hq, P.Sq, P.D)
    lse = np.frombuffer(out[2 * n_o:2 * n_o + 4 * P.B * P.Hq * P.Sq], np.float32).astype(np.float64)
    return KernelRun(True, "", trace, stats, o, lse.reshape(P.B, P.Hq, P.Sq))


def _who(tid: int) -> str:
    return "the producer" if tid < 128 else f"consumer warpgroup {tid // 128 - 1}"


def deadlock(msg: str) -> dict | None:
    """The emulation's deadlock report, parsed: waiters [(who, text, detail)], barriers, holds."""
    if not msg.startswith("DEADLOCK"):
        return None
    groups, bars, holds = {}, {}, {}
    for ln in msg.splitlines()[1:]:
        f = ln.split()
        if f[0] == "waiter" and f[2] == "mbar":
            tid, (bid, parity, done, pending, _, uses) = int(f[1]), map(int, f[3:9])
            key = (_who(tid), "mbar", bid, parity)
            groups.setdefault(key, dict(n=0, done=done, pending=pending, uses=uses))["n"] += 1
        elif f[0] == "waiter" and f[2] == "named":
            tid, (bid, count, arrived) = int(f[1]), map(int, f[3:6])
            groups.setdefault((_who(tid), "named", bid, count), dict(n=0, arrived=arrived))["n"] += 1
        elif f[0] == "bar":
            bars[int(f[1])] = tuple(map(int, f[2:5]))
        elif f[0] == "hold":
            holds[(int(f[1]), int(f[2]))] = tuple(map(int, f[3:5]))
    lines = []
    for (who, kind, bid, arg), g in sorted(groups.items(), key=lambda kv: (kv[0][0] != "the producer", kv[0])):
        many = f" ({g['n']} threads)" if g["n"] > 1 else ""
        if kind == "named":
            lines.append(f"{who}{many} waits at named barrier {bid} (a GEMM turn: {g['arrived']} of {arg} threads "
                         "have arrived)")
            continue
        name = BARS[bid] if 0 <= bid < len(BARS) else f"mbarrier {bid}"
        state = f"{name} has completed {g['done']} phase{'s' if g['done'] != 1 else ''}"
        if bid in EMPTY_BARS:
            state += f"; {8 - g['pending']} of 8 consumer warps have arrived in the current one"
        lines.append(f"{who}{many} waits on {name} with parity {arg} ({state})")
    return dict(lines=lines, groups=groups, bars=bars, holds=holds)


# ----------------------------------------------------------------------------- producer
def _events(trace: np.ndarray) -> list[dict]:
    """The producer's calls, tile barriers (the given scheduler's) left out."""
    keys = ("kind", "bar", "arg", "map", "dst", "c0", "c1", "c2", "c3", "phase", "ret")
    return [dict(zip(keys, map(int, r))) for r in trace if not (10 <= r[1] <= 13 and r[0] != TMA)]


def _tma_key(e) -> tuple:
    return (e["map"], e["dst"], e["bar"], e["c0"], e["c1"], e["c2"], e["c3"])


def _per_map(tmas: list[tuple]) -> list[list[tuple]]:
    return [[x for x in tmas if x[0] == m] for m in range(3)]


# (keywords of schedule, the cause), as data beside the emulator's C++
_PRODUCER_MISTAKES = tuple((m["schedule"], m["cause"]) for m in tomllib.loads(
    (Path(__file__).parent / "emu" / "producer_mistakes.toml").read_text(encoding="utf-8"))["mistake"])


def _describe_tma(w: dict, key: tuple | None) -> str:
    where = f"tile (m_block {w['m_block']}, head {w['h']}, batch {w['b']})"
    if w["map"] == "Q":
        want = f"Q_i, {where}, panel {w['panel']}"
    else:
        want = (f"{w['map']}_j of {where}: key block j = {w['j']}, ring position it = {w['it']} (slot {w['slot']}), "
                f"KV head {w['hk']}, panel {w['panel']}")
    if key is None:
        return f"{want}: never loaded"
    m, dst, bar, c0, c1, c2, c3 = key
    return (f"{want}; your TMA: tensor map {MAPS[m] if 0 <= m < 3 else '?'}, destination smem + {dst}, barrier "
            f"{BARS[bar] if 0 <= bar < len(BARS) else '(no mbarrier)'}, coordinates ({c0}, {c1}, {c2}, {c3})")


def _expected_tma(P: Problem) -> tuple[list[tuple], list[dict]]:
    pops, _, what = schedule(P)
    return [(o[4], o[5], o[2], o[6], o[7], o[8], o[9]) for o in pops if o[1] == TMA], what


def _diagnose_tmas(P: Problem, events: list[dict], complete: bool) -> str | None:
    """Compare the producer's TMA calls (per tensor map, in order) with the schedule and its mistakes."""
    got = _per_map([_tma_key(e) for e in events if e["kind"] == TMA])
    want_all, what = _expected_tma(P)
    want = _per_map(want_all)

    def agrees(w, g):
        return all((g[m] == w[m]) if complete else (g[m] == w[m][:len(g[m])]) for m in range(3))

    if agrees(want, got):
        return None
    for mistake, cause in _PRODUCER_MISTAKES:
        pops, _, _ = schedule(P, **mistake)
        alt = _per_map([(o[4], o[5], o[2], o[6], o[7], o[8], o[9]) for o in pops if o[1] == TMA])
        if alt != want and any(got) and agrees(alt, got):
            return cause
    whats = [[w for w in what if w["map"] == name] for name in MAPS]
    for m in range(3):
        for i, w in enumerate(whats[m]):
            g = got[m][i] if i < len(got[m]) else None
            if g is None and not complete:
                break
            if g != want[m][i]:
                return "the TMA loads differ from the schedule at " + _describe_tma(w, g) + _tma_hint(P, w, g, want[m][i])
        if len(got[m]) > len(want[m]):
            extra = got[m][len(want[m])]
            return (f"{len(got[m])} TMA loads of {MAPS[m]}, {len(want[m])} expected; the first extra one: destination "
                    f"smem + {extra[1]}, coordinates {extra[3:]}")
    return None


def _tma_hint(P: Problem, w: dict, g: tuple | None, want: tuple) -> str:
    if g is None:
        return ""
    m, dst, bar, c0, c1, c2, c3 = g
    if m != want[0]:
        return f". It loads from tm_{MAPS[m].lower() if 0 <= m < 3 else '?'}: {w['map']} comes from tm_{w['map'].lower()}"
    if bar != want[2]:
        name = BARS[bar] if 0 <= bar < len(BARS) else bar
        return f". Its barrier is {name}: the loads into a slot complete on that slot's full barrier, {BARS[want[2]]}"
    if dst != want[1]:
        if w["map"] == "Q":
            return (f". Q_i's panel c goes to smem + L::kQ + c * BLOCK_M * 128 (= {want[1]})")
        return (f". {w['map']}_j goes to slot(it) = {w['slot']}: smem + L::k{w['map']} + slot * L::kKVBytes + "
                f"c * BLOCK_N * 128 (= {want[1]})")
    if (c0, c1, c2, c3) != want[3:]:
        return f". The coordinates are (column, row, head, batch) = {want[3:]}"
    return ""


def _diagnose_bytes(P: Problem, events: list[dict], complete: bool) -> str | None:
    """One mbar_expect_tx per fill of a slot, announcing the fill's bytes (the loads already match)."""
    lay = P.layout()
    for bid in (0, 2, 3, 6, 7):
        want = lay["Q_bytes"] if bid == 0 else lay["KV_bytes"]
        name = "L::kQBytes" if bid == 0 else "L::kKVBytes"
        fills = sum(1 for e in events if e["kind"] == TMA and e["bar"] == bid) // (P.D // H_PANEL)
        expects = [e["arg"] for e in events if e["kind"] == EXPECT and e["bar"] == bid]
        if not fills:
            continue
        if not expects:
            return (f"no mbar_expect_tx on {BARS[bid]}: the producer's one arrival on a full barrier is the "
                    f"expect_tx announcing the fill's bytes ({name} = {want}); without it the consumers wait forever")
        if len(expects) > fills + (0 if complete else 1):
            return (f"{len(expects)} mbar_expect_tx on {BARS[bid]} for {fills} fills: a full barrier counts one "
                    f"arrival per phase, so announce a whole fill at once ({name} = {want} bytes), not panel by panel")
        if any(x != want for x in expects):
            x = next(x for x in expects if x != want)
            return (f"mbar_expect_tx announces {x} bytes on {BARS[bid]}; a fill loads {want} ({name}: "
                    f"{'BLOCK_M' if bid == 0 else 'BLOCK_N'} * D * 2 bytes, all D / 64 panels). The phase completes "
                    "when exactly the announced bytes have landed")
        if len(expects) < fills:
            return (f"{fills} fills of {BARS[bid]}'s slot but {len(expects)} mbar_expect_tx: announce the bytes of "
                    "every fill")
    return None


def _diagnose_waits(events: list[dict]) -> str | None:
    """Before it reloads a slot, the producer waits on the slot's empty barrier with parity phase(it) ^ 1."""
    for full, empty, name in [(0, 1, "Q")] + [(_bar(k + "_full", s), _bar(k + "_empty", s), f"{k.upper()} slot {s}")
                                            for s in range(H_STAGES) for k in "kv"]:
        starts = []                                        # event index of each fill's first load
        seen = set()
        for i, e in enumerate(events):
            if e["kind"] == TMA and e["bar"] == full and e["phase"] not in seen:
                seen.add(e["phase"])
                starts.append(i)
        waits = [(i, e) for i, e in enumerate(events) if e["kind"] == WAIT and e["bar"] == empty]
        for n, start in enumerate(starts + [len(events)]):   # the last: a fill the producer is waiting to load
            lo = starts[n - 1] if n else -1
            mine = [e["arg"] for i, e in waits if lo < i < start]
            if n == len(starts) and not mine:
                break
            what = ("Q (a new tile's Q_i)" if full == 0 else f"{name}") + f" for the {_ordinal(n + 1)} time"
            if n == 0:
                if 0 in mine:
                    return (f"the producer waits on {BARS[empty]} with parity 0 before it first loads {name}: a fresh "
                            "barrier is in phase 0, which completes only when the consumers release the slot, so "
                            "this waits forever. Wait with parity phase(it) ^ 1 (1 on the first pass over the ring: "
                            "a fresh barrier counts as released)" if full else
                            "the producer waits on q_empty before the first tile's Q: nothing has released it yet, "
                            "so this waits forever; wait from the second tile on, with parity (round - 1) & 1")
                continue
            need = (n - 1) & 1
            if need in mine:
                continue
            after = [e["arg"] for i, e in waits if start < i < (starts[n + 1] if n + 1 < len(starts) else len(events))]
            if n == len(starts):
                after = []
            if need in after:
                return (f"the producer loads {what} before waiting on {BARS[empty]}: wait for the slot to be released, "
                        "then announce and load")
            if mine:
                return (f"the producer reloads {what} after waiting on {BARS[empty]} with parity {mine[-1]}; that "
                        f"fill needs parity {need} (" + ("phase(it) ^ 1, `it` the ring position" if full else
                                                         "(round - 1) & 1, round = the tiles loaded so far")
                        + "): with the wrong parity the wait returns while the consumers still read the slot, or "
                          "never")
            return (f"the producer reloads {what} without waiting on {BARS[empty]}: the consumers may still be "
                    "reading it. Wait for it to be released first (parity " + ("phase(it) ^ 1)" if full else
                                                                             "(round - 1) & 1)"))
    return None


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


_VERIFY = re.compile(r"VERIFY (Q|[KV] slot \d) (-?\d+) (-?\d+) (-?\d+) (-?\d+) (\d+) found (.*)")


def _verify_text(msg: str) -> str:
    """The oracle consumers' finding (what a slot holds when they read it) in words."""
    m = _VERIFY.match(msg)
    if m is None:
        return msg
    region, (mi, row, h, b, panel), found = m[1], map(int, m.groups()[1:6]), m[7].split()
    want = f"{MAPS[mi]} rows {row}-{row + H_ROWS - 1} of head {h}, batch {b}, columns {64 * panel}-{64 * panel + 63}"
    if found[0] == "unwritten":
        have = "nothing: no TMA wrote it"
    elif found[0] == "none":
        have = "data that is no box of Q, K or V"
    else:
        fm, c0, r0, fh, fb = map(int, found)
        have = f"{MAPS[fm]} rows {r0}-{r0 + H_ROWS - 1} of head {fh}, batch {fb}, columns {c0}-{c0 + 63}"
    return f"when the consumers read {region}, it holds {have} instead of {want}"


def check_producer(binary: Path) -> FunctionResult:
    for P in PRODUCER_PROBLEMS:
        run = run_kernel(binary, P, oracle_producer=False, oracle_consumer=True)
        events = _events(run.trace)
        where = f"[case: {P.text()}] "
        if not run.stats:
            return FunctionResult("producer", "fail", where + f"the emulated CTA stopped: {run.message}")
        if not any(e["kind"] in (TMA, EXPECT) for e in events):
            return FunctionResult("producer", "fail", where + "the producer loads nothing (no TMA, no expect_tx): "
                                  "the consumers wait for Q_i forever")
        for diagnose in (lambda: _diagnose_tmas(P, events, run.ok), lambda: _diagnose_bytes(P, events, run.ok),
                         lambda: _diagnose_waits(events)):
            if (msg := diagnose()) is not None:
                return FunctionResult("producer", "fail", where + msg)
        if not run.ok:
            dl = deadlock(run.message)
            if dl is not None:
                return FunctionResult("producer", "fail", where + "deadlock with the (correct) consumers: "
                                      + "; ".join(dl["lines"]))
            if run.message.startswith("VERIFY"):
                return FunctionResult("producer", "fail", where + _verify_text(run.message))
            return FunctionResult("producer", "fail", where + run.message)
    return FunctionResult("producer", "pass", f"{len(PRODUCER_PROBLEMS)} problems against consumers that check "
                          "every slot: tiles, key blocks right to left, GQA, coordinates, bytes, waits and parities")
