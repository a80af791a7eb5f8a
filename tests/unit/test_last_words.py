"""Why a replica failed, read from its log's end where its exit code alone does not say
(``corral.runtime.logs.last_words``)."""

from __future__ import annotations

from pathlib import Path

from corral.runtime.logs import last_words


def test_a_container_engine_s_own_failure_is_said(tmp_path: Path) -> None:
    """Podman exits 125 when it cannot run the container at all (a bind's source deleted since
    submission, an option it refuses): its ``Error:`` line is the reason, not "exit code 125"
    alone (new-user trial)."""
    log = tmp_path / "r.log"
    log.write_text("corral: pulling busybox\nError: statfs /srv/data: no such file or directory\n")
    assert last_words(log, code=125) == "its container engine said: Error: statfs /srv/data: no such file or directory"
    log.write_text("docker: Error response from daemon: invalid mount config.\nSee 'docker run --help'.\n")
    assert last_words(log, code=125) == ("its container engine said: docker: Error response from daemon: "
                                         "invalid mount config.")
    log.write_text("Error: statfs /srv/data: no such file or directory\n")
    assert last_words(log, code=1) == ""  # the program's own exit: its own words are its business
    log.write_text("training failed\n")
    assert last_words(log, code=125) == ""
