"""csvstats: an htfaas function in Python (standard library only).

The guest contract (the same for every language):
- argv[1] is the input file, `/input/<name>` (read-only); later arguments are the manifest's args;
- every top-level file the function leaves in `/output` is stored in the function's output
  directory, under the same name (subdirectories are not stored);
- the environment holds exactly the manifest's env; there is no network;
- exit status 0 means success; anything else (here: 1) fails the job, and stderr is kept in its log.

What it does: the input's size, line count and SHA-256, and, reading it as a CSV whose first row
is the header, the number of rows and for each column the count, min, max and mean of the fields
that are numbers. Writes `/output/<name>.stats.json`. A row with another number of fields than the
header, or an input that is not UTF-8, fails the job with a message on stderr.

Built with `htfaas fn build` (componentize-py into a WASI preview 2 component). Code at module level
runs at build time (the interpreter is pre-initialised), so argv and files are read only in `run`.
"""

import csv
import hashlib
import io
import json
import math
import os
import sys

from componentize_py_types import Err
from wit_world import exports


def number(field: str):
    """The field as a finite float, or None."""
    try:
        x = float(field)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def summarize(path: str) -> dict:
    h, size, lines = hashlib.sha256(), 0, 0
    with open(path, "rb") as f:
        data = f.read()
    h.update(data)
    size, lines = len(data), data.count(b"\n")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte {e.start})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, [])
    columns = [{"name": name, "values": 0, "sum": [], "min": None, "max": None} for name in header]
    rows = 0
    for row in reader:
        if not row:
            continue  # blank line
        rows += 1
        if len(row) != len(header):
            raise ValueError(f"line {reader.line_num}: {len(row)} fields, the header has {len(header)}")
        for col, field in zip(columns, row):
            x = number(field)
            if x is None:
                continue
            col["values"] += 1
            col["sum"].append(x)
            col["min"] = x if col["min"] is None else min(col["min"], x)
            col["max"] = x if col["max"] is None else max(col["max"], x)
    out = []
    for col in columns:
        n = col["values"]
        out.append({
            "name": col["name"],
            "numbers": n,
            "min": col["min"],
            "max": col["max"],
            "mean": math.fsum(col["sum"]) / n if n else None,
        })
    return {
        "file": os.path.basename(path),
        "bytes": size,
        "lines": lines,
        "sha256": h.hexdigest(),
        "rows": rows,
        "columns": out,
    }


class Run(exports.Run):
    def run(self) -> None:
        try:
            if len(sys.argv) < 2:
                raise ValueError("usage: csvstats /input/<file>")
            src = sys.argv[1]
            stats = summarize(src)
            with open(os.path.join("/output", os.path.basename(src) + ".stats.json"), "w") as f:
                json.dump(stats, f, sort_keys=True)
        except Exception as e:  # a clean exit status 1 with a message, not a trap
            print(f"csvstats: {e}", file=sys.stderr)
            raise Err(None)
