"""A command for tests/workload/test_zygote.py: what a forked child sees (run as ``python -m``)."""

import os
import sys
import time

SEEN_AT_IMPORT = os.environ.get("PROBE", "")  # a module reading its environment when imported, as workload's do

print(f"cwd={os.getcwd()} probe={SEEN_AT_IMPORT} argv={sys.argv[1:]}", flush=True)
print("to stderr", file=sys.stderr, flush=True)
what = sys.argv[1]
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "stdin":
    print(f"stdin={sys.stdin.read()!r}")
if what == "message":
    sys.exit("a message")
if what == "raise":
    raise ValueError("uncaught")
if what == "sleep":
    time.sleep(60)
