"""Tokenize a corpus into prepared shards for training: see titanlite/data/prepare.py.

python scripts/prepare_data.py CORPUS... --output DIR [--tokenizer PATH] [--workers N]
"""

import sys

from titanlite.data.prepare import main

if __name__ == "__main__":
    sys.exit(main())
