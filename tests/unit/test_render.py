"""CLI tables: fit a terminal's width without losing the ID, and print plain tab-separated
rows to a pipe."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.cli.render import GAP, Column, layout, table

QUEUE = [Column("ID", key=True, right=True), Column("NAME", min_width=8), Column("USER", optional=2),
         Column("STATE"), Column("GPUS", right=True, optional=1), Column("REASON", fold=True, min_width=10)]


def _rows(n: int) -> list[list[str]]:
    return [[str(1000 + i), "a-very-long-job-group-name-for-rollouts-%d" % i, "alice-the-researcher",
             "PENDING", "16", "QOSMaxGPUsPerUser: alice already holds 16 of 16 GPUs in qos normal"]
            for i in range(n)]


def test_natural_widths_when_everything_fits():
    cells = [["1", "a", "bob", "RUNNING", "1", "-"]]
    keep, widths = layout(QUEUE, cells, 200)
    assert keep == list(range(len(QUEUE)))
    assert widths == {0: 2, 1: 4, 2: 4, 3: 7, 4: 4, 5: 6}


def test_eighty_columns_keep_the_id_whole_and_fit():
    cells = _rows(3)
    keep, widths = layout(QUEUE, cells, 80)
    assert 0 in keep and widths[0] == 4  # the ID is never cut
    assert sum(widths[i] for i in keep) + GAP * (len(keep) - 1) <= 80
    assert widths[5] < len(cells[0][5])  # the reason folds rather than pushing the row wider


def test_optional_columns_go_highest_first_when_too_narrow():
    cells = _rows(1)
    keep, _ = layout(QUEUE, cells, 44)
    assert 2 not in keep  # USER (optional=2) is left out first
    keep, _ = layout(QUEUE, cells, 38)
    assert 2 not in keep and 4 not in keep and 0 in keep


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.text(alphabet="abcXYZ0123 -:", max_size=60), min_size=6, max_size=6),
                min_size=1, max_size=5),
       st.integers(min_value=40, max_value=240))
def test_any_rows_fit_any_reasonable_width(cells, width):
    for row in cells:
        row[0] = row[0][:8] or "1"
    keep, widths = layout(QUEUE, cells, width)
    assert 0 in keep
    assert widths[0] == max(len("ID"), *(len(r[0]) for r in cells))
    assert sum(widths[i] for i in keep) + GAP * (len(keep) - 1) <= width


def test_terminal_table_lines_fit_80_columns(capsys):
    table(QUEUE, _rows(4), width=80, tty=True)
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0].split()[0] == "ID"
    assert all(len(line.rstrip()) <= 80 for line in lines), lines
    for i in range(4):
        assert any(line.lstrip().startswith(str(1000 + i)) for line in lines)


def test_piped_table_is_tab_separated_with_a_header(capsys):
    table(QUEUE, _rows(2) + [["7", "x\ty", None, "RUNNING", "1", "line\nbreak"]], tty=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "ID\tNAME\tUSER\tSTATE\tGPUS\tREASON"
    assert all(line.count("\t") == 5 for line in lines)
    assert lines[1].split("\t")[5] == "QOSMaxGPUsPerUser: alice already holds 16 of 16 GPUs in qos normal"
    assert lines[3].split("\t") == ["7", "x y", "-", "RUNNING", "1", "line break"]
