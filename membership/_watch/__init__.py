"""Watching the view (private): subscriptions to the arbiters, and the events passed on.

- :mod:`~membership._watch.feed`: the sans-I/O subscriber core (epoch order,
  gaps, duplicates, failover, loss of contact);
- :mod:`~membership._watch.subscription`: :class:`Watcher`, its asyncio shell
  (opens, hedges and replaces Subscribe calls as the feed decides).
"""
