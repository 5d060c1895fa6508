"""`python -m relsql.cli`: the command line."""

import sys

from relsql.cli import main

sys.exit(main())
