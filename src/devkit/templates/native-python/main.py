# __NAME__: an htfaas native function (Python with numpy), made by `htfaas fn new`.
#
# The guest contract: argv[1] is the input file, /input/<name> (read-only); the files left at
# the top of /output are stored in the function's output directory when the run succeeds; the
# environment is exactly the manifest's env and secrets; exit status 0 is success; stdout and
# stderr are the job's log. No network; the image is the read-only root; /tmp is private.
import json
import os
import sys

import numpy as np

path = sys.argv[1]
a = np.fromfile(path, dtype="<f4")
stats = {"n": int(a.size), "mean": float(a.astype(np.float64).mean()) if a.size else None,
         "std": float(a.std()) if a.size else None}
with open(os.path.join("/output", os.path.basename(path) + ".json"), "w") as f:
    json.dump(stats, f)
print(f"{path}: {a.size} samples")
