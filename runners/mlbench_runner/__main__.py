"""``python -m mlbench_runner`` is ``mlbench-runner``."""

import sys

from mlbench_runner.cli import main

sys.exit(main())
