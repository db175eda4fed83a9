import sys

from coec.cli import main

sys.exit(main())
