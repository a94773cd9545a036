#!/usr/bin/env python3
"""One decode step's kernels from an Nsight Compute CSV (scripts/gpu-profile.sh).

    ncu-step.py PROFILE.csv [--start get_rows] [--step-us US] [--bw TB/s] [--model-bytes N]

Reads `ncu --csv --page raw --print-units base` output (one row per kernel
launch, graph nodes included, in launch order), cuts it into steps at each
launch of the step's first kernel (`--start`, default get_rows: the
embedding lookup that opens every forward), takes the last complete step
(between the last two starts) and prints, per kernel name: launches,
summed and mean duration, DRAM bytes and the rate they moved at. With
`--step-us` (the step's wall time from `quire bench`, 1e6 / tokens/s) it
also prints how much of the step the kernels' own durations cover: ncu
runs each kernel alone (serialized), so the rest is what launches, graph
edges and waits between kernels cost, less what consecutive kernels
overlap in the graph (programmatic dependent launch): on an H200 the
rest came out negative (2026-11-27: the chain's kernels alone took
1.26x (8B Q4_0) to 1.62x (SmolLM2) the wall time). Kernels of a side branch (`--side`, default l2_ahead:
the L2 read-ahead, which runs beside the whole step) are listed but
left out of the sums. With `--bw` and
`--model-bytes`, each row's share of the step's byte roofline.
"""
import argparse
import csv
import sys
from collections import OrderedDict

TIME = "gpu__time_duration.sum"
RD = "dram__bytes_read.sum"
WR = "dram__bytes_write.sum"


def load(path):
    """Rows of (name, ns, bytes read, bytes written), in launch order."""
    with open(path, newline="") as f:
        # ncu prints its own log lines (==PROF==) before the table.
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        sys.exit(f"{path}: no CSV rows (did ncu profile any kernel?)")
    head = rows[0]
    for col in ("Kernel Name", TIME):
        if col not in head:
            sys.exit(f"{path}: no column {col!r} (columns: {', '.join(head)})")
    ix = {c: head.index(c) for c in head}
    out = []
    for r in rows[1:]:
        if len(r) != len(head) or not r[ix["ID"]].strip().isdigit():
            continue  # the units row, or a truncated line

        def num(col):
            if col not in ix:
                return 0.0
            v = r[ix[col]].replace(",", "").strip()
            try:
                return float(v)
            except ValueError:
                return 0.0

        out.append((r[ix["Kernel Name"]].split("(")[0].strip(), num(TIME), num(RD), num(WR)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--start", default="get_rows")
    ap.add_argument("--step-us", type=float)
    ap.add_argument("--bw", type=float, help="copy bandwidth, TB/s (read + write)")
    ap.add_argument("--model-bytes", type=float)
    ap.add_argument(
        "--side",
        default="l2_ahead",
        help="comma-separated kernels of a side branch (listed, left out of the chain's sums)",
    )
    a = ap.parse_args()
    side = {n for n in a.side.split(",") if n}
    rows = load(a.csv)
    starts = [i for i, r in enumerate(rows) if r[0] == a.start]
    if len(starts) < 2:
        sys.exit(f"{a.csv}: fewer than two launches of {a.start!r}: no complete step ({len(rows)} kernels)")
    step = rows[starts[-2] : starts[-1]]
    per = OrderedDict()
    for name, ns, rd, wr in step:
        p = per.setdefault(name, [0, 0.0, 0.0, 0.0])
        p[0] += 1
        p[1] += ns
        p[2] += rd
        p[3] += wr
    # A side branch (the L2 read-ahead) runs beside the chain for the
    # whole step: under ncu it runs alone and its time is its patience,
    # not a cost of the chain, so the sums below leave it out.
    chain = {n: p for n, p in per.items() if n not in side}
    n_chain = sum(p[0] for p in chain.values())
    total_ns = sum(p[1] for p in chain.values())
    total_b = sum(p[2] + p[3] for p in chain.values())
    print(f"one step: {len(step)} kernels (launches {starts[-2]}..{starts[-1] - 1} of {len(rows)})\n")
    print("| kernel | launches | us (sum) | us (mean) | share | DRAM MB | GB/s |")
    print("|---|---|---|---|---|---|---|")
    for name, (cnt, ns, rd, wr) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        gbs = (rd + wr) / ns if ns else 0.0
        share = "side" if name in side else f"{ns / total_ns:.1%}"
        print(
            f"| {name} | {cnt} | {ns / 1e3:,.1f} | {ns / 1e3 / cnt:.2f} | {share} "
            f"| {(rd + wr) / 1e6:,.1f} | {gbs:,.0f} |"
        )
    print(f"| chain | {n_chain} | {total_ns / 1e3:,.1f} | | | {total_b / 1e6:,.1f} | {total_b / total_ns if total_ns else 0:,.0f} |")
    if a.step_us:
        print(
            f"\nstep wall time {a.step_us:,.1f} us; kernels alone {total_ns / 1e3:,.1f} us "
            f"({total_ns / 1e3 / a.step_us:.1%}); the rest {a.step_us - total_ns / 1e3:,.1f} us "
            f"({(a.step_us - total_ns / 1e3) / n_chain * 1e3:,.0f} ns per launch; "
            "negative: consecutive kernels overlap in the graph, by programmatic dependent launch)"
        )
    if a.bw and a.model_bytes:
        roof_us = a.model_bytes / (a.bw * 1e12) * 1e6
        print(f"byte roofline {roof_us:,.1f} us per step ({a.model_bytes / 1e9:.2f} GB at {a.bw} TB/s)")
        if a.step_us:
            print(f"step at {roof_us / a.step_us:.1%} of it; the kernels alone at {roof_us / (total_ns / 1e3):.1%}")


if __name__ == "__main__":
    main()
