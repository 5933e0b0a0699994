"""`python -m titanlite.preflight --config ... [overrides]`: the checks in one process (what
run_train.sh does before torchrun); exit 2 with one line on the first problem."""

import sys

from titanlite.preflight.checks import main

sys.exit(main())
