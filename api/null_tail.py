"""The rows a bounded keyset leaves out: those whose first sort key is null.

``query.tree.after`` bounds a descending walk by ``key <= marker's value`` when the field
registry says the key is never null (``created_at``): a plain range lets SQLite seek its
index to the marker instead of scanning from the top. A row that has no value there all
the same (written into a cell by hand: Nova always sets ``created_at``) sorts after every
value, nulls last, and the bound would leave it out of every page after the first: a
walk by marker never reached it (an adversarial probe). Those rows come after all the
bounded ones, so a page the bounded query left short is filled from them, in the same
order, by a second query of only them (``tail``).
"""

from __future__ import annotations

from collections.abc import Collection

from cellsight.query.tree import Direction, Exists, Not, SearchRequest, conjunction


def tail(request: SearchRequest, got: int, never_null: Collection[str]) -> SearchRequest | None:
    """The request for the rest of a page of ``request`` that returned ``got`` rows: its
    rows whose first sort key is null, which the keyset's bound left out; None when the
    page is full or the bound left nothing out."""
    if request.after is None or got >= request.limit or not request.order:
        return None
    first = request.order[0]
    if (
        first.field not in never_null
        or first.field == "uuid"  # every row has one: nothing to fill from
        or first.direction is not Direction.DESC
        or request.after[0] is None  # after a null the keyset has no bound
    ):
        return None
    # Every such row sorts after the marker (nulls last): no keyset among them.
    return SearchRequest(
        conjunction(request.filter, Not(Exists(first.field))),
        request.order,
        request.limit - got,
    )
