"""`python -m legion`."""

import sys

from legion.cli import main

sys.exit(main())
