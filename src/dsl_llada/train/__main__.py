"""`python -m dsl_llada.train --config FILE key=value ...` (same as `dsl-llada train`)."""

import sys

from .train_cli import main

sys.exit(main())
