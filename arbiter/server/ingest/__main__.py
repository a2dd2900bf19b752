"""``python -m arbiter.server.ingest --fd N``: one ingest worker (started by the pool only).

Tied to the consensus process before anything else is imported (worker.py rule 5).
"""

from arbiter.server.ingest.lifetime import die_with_parent

die_with_parent()

from arbiter.server.ingest.worker import main  # noqa: E402

raise SystemExit(main())
