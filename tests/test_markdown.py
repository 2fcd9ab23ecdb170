"""The markdown table every report and benchmark prints."""

import pytest

from visemz import markdown


def test_header_separator_and_rows():
    assert markdown.table(["a", "b"], [[1, "x"], [2.5, None]]) == ["| a | b |", "|---|---|", "| 1 | x |",
                                                                    "| 2.5 | None |"]


def test_no_rows_is_the_header_alone():
    assert markdown.table(["only"], []) == ["| only |", "|---|"]


def test_a_row_of_another_length_is_refused():
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        markdown.table(["a", "b", "c"], [["x", "y"]])
