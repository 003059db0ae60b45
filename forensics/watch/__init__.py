"""Watching a running job: the same detectors and diagnosis as ``analyze``, on every poll.

- :mod:`forensics.watch.tail`: :class:`RunTail` reads a run folder incrementally.
- :mod:`forensics.watch.alerts`: each finding alerts once (a stable identity), again when it
  escalates, and a note when it ends; the state survives a restarted watcher.
"""
