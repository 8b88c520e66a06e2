# __NAME__: an htfaas native function (Python with numpy), made by `htfaas fn new`.
#
# The guest contract: the input file is /input/<name> (read-only); the files left at the top of
# /output are stored in the function's output directory when the run succeeds; the environment
# is exactly the manifest's env and secrets; stdout and stderr are the run's log. No network;
# the image is the read-only root; /tmp is private.
#
# Two forms, one file:
# - `python3 /opt/app/main.py INPUT [ARGS]`: one process per run; exit status 0 is success.
# - `python3 /opt/app/main.py --serve` (register with --handler): one warm process serves run
#   after run (htfaas_handler.py), so numpy is imported once per worker, not once per run.
import json
import os
import sys

import numpy as np


def handle(path, output, args):
    """One run: `path` the input, `output` the directory to write into, `args` the manifest's."""
    a = np.fromfile(path, dtype="<f4")
    stats = {"n": int(a.size), "mean": float(a.astype(np.float64).mean()) if a.size else None,
             "std": float(a.std()) if a.size else None}
    with open(os.path.join(output, os.path.basename(path) + ".json"), "w") as f:
        json.dump(stats, f)
    print(f"{path}: {a.size} samples")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        import htfaas_handler

        htfaas_handler.serve(handle)
    else:
        handle(sys.argv[1], "/output", sys.argv[2:])
