"""``python -m membership`` is the ``membership`` command."""

from membership.cli import main

raise SystemExit(main())
