import sys

from paramedic.cli import main

sys.exit(main())
