"""``python -m membership`` is the ``membership`` command (``membership/_entry.py``)."""

from membership._entry import run

run()
