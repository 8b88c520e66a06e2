"""A test guest (tests/e2e/python.rs): writes /output/started, then waits (up to 120 s) until
/input/go exists, then exits 0. Its runs overlap for as long as the test wants."""

import os
import time

from componentize_py_types import Err
from wit_world import exports


class Run(exports.Run):
    def run(self) -> None:
        with open("/output/started", "w") as f:
            f.write("started\n")
        deadline = time.monotonic() + 120
        while not os.path.exists("/input/go"):
            if time.monotonic() > deadline:
                raise Err(None)
            time.sleep(0.01)
