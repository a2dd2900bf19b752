"""``python -m arbiter ...`` is ``membership arbiter ...``."""

import sys

from membership.cli import main

raise SystemExit(main(["arbiter", *sys.argv[1:]]))
