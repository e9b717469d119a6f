"""``python -m tests.cluster up|down|env|status|build|import-image ARCHIVE``."""

import sys

from tests.cluster.cluster import main

sys.exit(main())
