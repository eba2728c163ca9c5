import sys

from actorpy.entry import main  # a Ctrl-C while the command line loads: status 130

sys.exit(main())
