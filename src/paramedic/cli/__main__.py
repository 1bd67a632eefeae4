"""`python -m paramedic.cli`: `main` alone, without `run`'s end of the process."""

import sys

from paramedic.cli import main

sys.exit(main())
