"""What the token cache asks of a task's source: two small typed protocols.

A SeqIO task's source is cached by the index reader when it can say which files it reads
and when they change (`CachedSource`: vmx/data/sources.py `SplitSource`, vmx/data/nway.py
`NwaySource`, a dev set's `HeldOut`). An N-way source (`NwayGroups`: `NwaySource` and its
hard-negative variant) stores whole groups of translations and draws the views a row
reads when the row is read (vmx/data/views.py). The cache writer, the fingerprint and the
pipeline ask `isinstance(source, ...)` of these, in one place each, instead of probing
for methods.
"""
from __future__ import annotations

from typing import Optional, Protocol, Sequence, runtime_checkable

from vmx.data import views


@runtime_checkable
class CachedSource(Protocol):
  """A source whose examples the token cache may keep."""

  @property
  def paths(self) -> Sequence[str]:
    """The files the examples are read from (what the cache's record stamps)."""

  def fingerprint(self) -> str:
    """What the examples are made of; another value means the cache is stale."""


@runtime_checkable
class NwayGroups(CachedSource, Protocol):
  """A source of groups of N translations, stored whole, views drawn when read."""

  def stored_examples(self, task, split: str, lengths, start: int = 0,
                      end: Optional[int] = None):
    """Numpy batches of the stored groups [start, end) (`tokens`, `present`)."""

  def view_draw(self) -> views.Draw:
    """How a read row's views (and hard negative) are drawn."""


def view_draw(source) -> Optional[views.Draw]:
  """How an N-way source's rows draw their views (None: another source)."""
  return source.view_draw() if isinstance(source, NwayGroups) else None
