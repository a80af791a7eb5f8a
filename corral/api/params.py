"""Parameters several routes share: ids and cursors, bounded by what an id column can hold
(``corral.store.ids``), so a number no row could have gets a 422 naming the parameter instead
of reaching the database, on SQLite and PostgreSQL alike."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from corral.store.ids import MAX_ID

Cursor = Annotated[int | None, Query(ge=0, le=MAX_ID, description=(
    "Cursor: the rows with a higher id, oldest first. A full page answers with the next cursor in the "
    "X-Next-After header"))]
ArrayId = Annotated[int | None, Query(ge=0, le=MAX_ID, description="Only the elements of this job array (a job id)")]
TokenId = Annotated[int, Path(ge=1, le=MAX_ID)]
