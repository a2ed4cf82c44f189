"""`python -m workload` (the container's entrypoint): run the command, then leave without the interpreter's
teardown.

Why: pyarrow's Parquet thread pool can abort the process while the interpreter tears it down ("terminate
called without an active exception", SIGABRT; apache/arrow#34314, open). Seen here once in CI: a seed that
refused a bad file exited -6 instead of 2. The exit code is the product's contract with the Job (0: every
item done; 2, 3, 4, 5: see workload/core/errors.py), so it must not depend on a race in a library's destructors.
By the time `main` returns, every file is closed and every temporary folder removed (context managers), so
flushing the logs and the standard streams is all the teardown that matters.
"""

import logging
import os
import sys

from workload.cli import main


def _code(exit_value: object) -> int:
    """An exit code from what `main` returned or `SystemExit` carried (argparse: 0 for --help, 2 for usage)."""
    if exit_value is None:
        return 0
    if isinstance(exit_value, int):
        return exit_value
    print(exit_value, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1


try:
    code = _code(main())
except SystemExit as exc:
    code = _code(exc.code)
logging.shutdown()
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except (OSError, ValueError):  # a reader that went away, or a stream already closed: nothing to keep
        pass
os._exit(code)
