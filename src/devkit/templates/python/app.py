"""__NAME__: an htfaas function in Python (built with `htfaas fn build`, run with `htfaas fn run`).

The guest contract (the same for every language):
- argv[1] is the input file, `/input/<name>` (read-only); later arguments are the manifest's args
  (`htfaas fn register --arg …`);
- every top-level regular file left in `/output` is stored in the function's output directory
  under the same name; subdirectories and symbolic links are not stored;
- the environment holds exactly the manifest's env; there is no network, no other file;
- exit status 0 is success; anything else fails the job (a Python component can only say 0 or 1),
  and stdout/stderr are kept in the job's log (`htfaas jobs log ID`).

Python specifics: the standard library is there (no `socket`); packages must be pure Python
(numpy is not available: there is no WASI build of it). Code at module level runs at BUILD time
(the interpreter is pre-initialised into the component), so read argv and files only in `run`.
An uncaught exception would trap the guest: catch it and `raise Err(None)` for a clean exit 1.
"""

import hashlib
import json
import os
import sys

from componentize_py_types import Err
from wit_world import exports


def count(path: str) -> dict:
    h, size, lines, words = hashlib.sha256(), 0, 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            h.update(chunk)
            size += len(chunk)
            lines += chunk.count(b"\n")
            words += len(chunk.split())  # approximate at chunk borders; fine for a template
    return {"file": os.path.basename(path), "bytes": size, "lines": lines, "words": words, "sha256": h.hexdigest()}


class Run(exports.Run):
    def run(self) -> None:
        try:
            if len(sys.argv) < 2:
                raise ValueError("usage: __NAME__ /input/<file>")
            src = sys.argv[1]
            result = count(src)
            with open(os.path.join("/output", os.path.basename(src) + ".count.json"), "w") as f:
                json.dump(result, f, sort_keys=True)
            print(f"__NAME__: {result['lines']} lines")
        except Exception as e:
            print(f"__NAME__: {e}", file=sys.stderr)
            raise Err(None)  # exit status 1, not a trap
