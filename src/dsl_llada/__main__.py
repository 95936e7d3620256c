"""`python -m dsl_llada ...` (also what `accelerate launch -m dsl_llada train ...` runs)."""

import sys

from .cli.main import main

sys.exit(main())
