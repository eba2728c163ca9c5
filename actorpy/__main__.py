import sys

from actorpy.cli import main

sys.exit(main())
