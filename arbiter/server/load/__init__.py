"""How loaded and how late this replica is: what the interval, shedding and local health read.

- :mod:`~arbiter.server.load.monitor`: utilisation of the loop thread (schedstat)
  and the lateness sources of local health;
- :mod:`~arbiter.server.load.looplag`: how late the event loop runs a timer, and why;
- :mod:`~arbiter.server.load.readlag`: how late heartbeats are read (LEDBAT-style
  queueing delay).
"""
