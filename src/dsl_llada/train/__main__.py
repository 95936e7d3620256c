"""`python -m dsl_llada.train --config FILE key=value ...`: the main CLI's `dsl-llada train`."""

import sys

from ..cli.main import main

sys.exit(main(["train", *sys.argv[1:]]))
