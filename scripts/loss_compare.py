"""Compare two or more runs' metrics.jsonl step by step, check them equal, plot them: see
titanlite/tools/loss_compare.py.

python scripts/loss_compare.py RUN_A RUN_B [--metrics loss grad_norm] [--assert-equal] [--plot out.png]
"""

import sys

from titanlite.tools.loss_compare import main

if __name__ == "__main__":
    sys.exit(main())
