"""`python -m relsql`: the same command line as the `relsql` script (where the script is not on PATH)."""

import sys

from relsql.cli import main

sys.exit(main())
