"""Stall samples of a kernel per source line: ncu's per-instruction samples joined with the
cubin's line table.

    ncu --section WarpStateStats --section SourceCounters --import-source yes -o prof CMD
    ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv
    nvdisasm -g -c kernel.cubin > lines.sass        # built with -lineinfo (cuda_step does)
    python -m megakernel.bench.ncu_lines sass.csv lines.sass [--top 40]

Prints the source lines holding the most samples: their share of all samples and their three
largest stall reasons. Instruction addresses are matched as offsets from the kernel's first.
"""
from __future__ import annotations

import argparse
import collections
import csv
import re


def line_table(path: str) -> dict[int, str]:
    """nvdisasm -g output -> {instruction offset: 'file:line'}."""
    table, where = {}, "?"
    for text in open(path):
        m = re.search(r'//## File "([^"]+)", line (\d+)', text)
        if m:
            where = f"{m.group(1).split('/')[-1]}:{m.group(2)}"
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/", text)
        if m:
            table[int(m.group(1), 16)] = where
    return table


def samples_by_line(csv_path: str, table: dict[int, str]):
    """-> (samples per line, reasons per line, all samples)."""
    rows = list(csv.reader(open(csv_path)))
    header, data = rows[1], rows[2:]
    total_col = header.index("Warp Stall Sampling (All Samples)")
    reasons = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    base = int(data[0][0], 16)
    per_line, everything = collections.Counter(), 0.0
    why = collections.defaultdict(collections.Counter)
    for r in data:
        where = table.get(int(r[0], 16) - base, "?")
        n = float(r[total_col] or 0)
        everything += n
        per_line[where] += n
        for i in reasons:
            why[where][header[i].removeprefix("stall_")] += float(r[i] or 0)
    return per_line, why, everything


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sass_csv")
    ap.add_argument("lines_sass")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    per_line, why, everything = samples_by_line(args.sass_csv, line_table(args.lines_sass))
    for where, n in per_line.most_common(args.top):
        top = ", ".join(f"{k} {v / n * 100:.0f}%" for k, v in why[where].most_common(3) if v)
        print(f"{n / max(everything, 1) * 100:5.1f}%  {where:34s} {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
