"""A pending reason longer than the store's column (an engine's own words, as Slurm's can be)
is kept whole in the loop's memory and shortened where it is stored, never refused by the
database (PostgreSQL refuses a value longer than its column, and that would fail the cycle)."""

from __future__ import annotations

from types import SimpleNamespace

from corral.control.scheduling import Scheduling
from corral.store.tables import REASON_LENGTH


def test_a_long_reason_is_whole_in_memory_and_fits_the_column() -> None:
    stored: list[str] = []
    scheduling = Scheduling.__new__(Scheduling)  # only set_reason's two collaborators are needed
    scheduling.book = SimpleNamespace(reasons={})
    scheduling.moves = SimpleNamespace(journal=SimpleNamespace(job=lambda job_id, reason: stored.append(reason)))
    sentence = "ReqNodeNotAvail, UnavailableNodes:" + ",".join(f"gpu{i:03d}" for i in range(30))
    assert len(sentence) > REASON_LENGTH
    scheduling.set_reason(7, sentence)
    assert scheduling.book.reasons[7] == sentence
    assert len(stored[0]) == REASON_LENGTH and stored[0].startswith("ReqNodeNotAvail") and stored[0].endswith("…")
    scheduling.set_reason(7, sentence)  # unchanged: not written again
    scheduling.set_reason(7, "Resources")
    assert stored[1:] == ["Resources"]
