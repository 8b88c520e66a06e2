"""The handler form of an htfaas native function: one process serves run after run.

For each run the EP writes one request line of JSON to stdin,
    {"input": "/input/NAME", "args": [...], "output": "/output"}
(/input then holds that one file and /output is empty), and waits for one answer line on
descriptor 3,
    {"exit_code": N}
0 for success. What the run prints before the answer is its log. `serve(handle)` is that loop:
`handle(input, output, args)` returning None or an int exit code; an exception is printed and
answered with 1. The process serves one function version only, and is ended when idle, on a
new version, or on a revocation.
"""
import json
import os
import sys
import traceback


def serve(handle):
    answers = os.fdopen(3, "w", buffering=1)
    for line in sys.stdin:
        code = 0
        try:
            req = json.loads(line)
            result = handle(req["input"], req["output"], req.get("args", []))
            code = result if isinstance(result, int) else 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except Exception:
            traceback.print_exc()
            code = 1
        # The log first: what the run printed is read before its answer.
        sys.stdout.flush()
        sys.stderr.flush()
        answers.write(json.dumps({"exit_code": code}) + "\n")
