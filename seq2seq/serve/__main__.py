"""`python -m seq2seq.serve`: see seq2seq/serve/__init__.py."""

import sys

from seq2seq.serve.cli import main

sys.exit(main())
