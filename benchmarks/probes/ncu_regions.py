"""Step 07's kernel under Nsight Compute's source counters: the consumer warps' stall samples summed by region of
the SASS (the next tile's start, the first S, the first block's softmax, the loop's three parts, the last P V,
the epilogue), each region with its three commonest stall reasons. Reads the CSV of the source page of a report
taken with --section SourceCounters (v4_fwd_variants.py --one CONFIG gives the launch):

    ncu -i REPORT.ncu-rep --page source --print-source sass --csv | gzip > sass.csv.gz
    python benchmarks/probes/ncu_regions.py sass.csv.gz [LABEL]

The regions are cut at the kernel's own synchronisation, in the order the first kernel of the file meets them
(fp16, D 128): the consumers' setmaxnreg, each turn's BAR.SYNC, the releases of the ring's slots (mbarrier
arrivals), and the producer's setmaxnreg, which ends the consumer code.
"""
import collections
import csv
import gzip
import sys

REGIONS = ("next tile: its number, waits for Q and K", "first S (its turn)", "first block: mask, softmax, P",
           "loop: S_j and P V_{j+1} issued (turn)", "loop: wait for P V (after the softmax)",
           "loop: softmax, rescale, convert", "last P V", "epilogue: O / l, stores, lse")
TURN, RELEASE, ARRIVE = "BAR.SYNC.DEFER_BLOCKING R", "SYNCS.ARRIVE.TRANS64.A1T0", "BAR.ARV R"


def bounds(src: list[str]) -> list[int]:
    """The first index of each region and the end of the last, found by the markers in order."""
    def find(text, start, after=0):
        i = next(i for i in range(start, len(src)) if text in src[i])
        return i + after
    a = find("USETMAXREG.TRY_ALLOC", 0, 1)        # the consumers, after their setmaxnreg
    b = find(TURN, a)                              # the first S's turn
    c = find(RELEASE, b, 1)                        # after K's release: the first block's softmax
    d = find(TURN, c)                              # the loop's turn
    e = find(RELEASE, d, 1)                        # after K's release: to the wait for P V
    f = find(RELEASE, e, 1)                        # after V's release: softmax, rescale, convert
    g = find(RELEASE, f, 1)                        # after Q's release: the last P V
    h = find(RELEASE, find(ARRIVE, g), 1)          # after the last V's release: the epilogue
    end = find("USETMAXREG.DEALLOC", h, 1)         # the producer
    return [a, b, c, d, e, f, g, h, end]


def main(path: str, label: str = "") -> None:
    rows = list(csv.reader(gzip.open(path, "rt") if path.endswith(".gz") else open(path)))
    head, data = rows[1], rows[2:]
    col = {h: i for i, h in enumerate(head)}
    stalls = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    src = [r[col["Source"]] for r in data]
    samples = [int(r[col["Warp Stall Sampling (All Samples)"]]) for r in data]
    cut = bounds(src)
    total = sum(samples[cut[0]:cut[-1]])
    print(f"{label or path}: {total} samples of the consumer warps")
    for name, lo, hi in zip(REGIONS, cut, cut[1:]):
        n = sum(samples[lo:hi])
        why = collections.Counter()
        for r in data[lo:hi]:
            for s in stalls:
                why[s[6:]] += int(r[col[s]] or 0)
        print(f"  {label:17s} {name:42s} {100 * n / total:5.1f}%   "
              + " ".join(f"{k} {100 * v / max(n, 1):.0f}%" for k, v in why.most_common(3)))


if __name__ == "__main__":
    main(*sys.argv[1:3])
