"""`python -m loadfuzz`: the same as the `loadfuzz` command."""

import sys

from loadfuzz.cli import main

sys.exit(main())
