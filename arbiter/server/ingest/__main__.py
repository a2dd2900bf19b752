"""``python -m arbiter.server.ingest --fd N``: one ingest worker (started by the pool only)."""

from arbiter.server.ingest.worker import main

raise SystemExit(main())
