import sys

from workload.cli import main

sys.exit(main())
