import sys

from schedlib.cli import main

sys.exit(main())
