"""What the Markdown and HTML reports show: every column the CSV has (issue 7's list), the config as compact
JSON; and user strings drawn literally in the plots (``$M`` in a workload is no mathtext)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from matplotlib.text import Text

from schedlib.report import COLUMNS, compare, markdown_table, write_report, writers

DOLLARS = "matmul:M=$M,N=$N,K=64"


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return compare(["reduce:rows=64,cols=4096", DOLLARS], "h100", methods=("rule", "carver", "search"),
                   backend="estimate", trials=3)


def md_rows(text: str) -> list[list[str]]:
    """The cells of the Markdown report's table, unescaped (``\\|`` is a ``|`` inside a cell, ``\\$`` a ``$``)."""
    rows = [ln for ln in text.splitlines() if ln.startswith("| ")]
    return [[c.strip().replace("\\|", "|").replace("\\$", "$") for c in re.split(r"(?<!\\)\|", ln)[1:-1]]
            for ln in rows]


def test_the_markdown_table_has_every_csv_column(table: pd.DataFrame, tmp_path: Path) -> None:
    paths = write_report(table, tmp_path)
    csv = pd.read_csv(paths["csv"])
    header, *rows = md_rows(paths["markdown"].read_text())
    assert header == list(csv.columns) == COLUMNS
    for want in ("shape", "dtype", "config", "p20_us", "p80_us", "trials", "measured"):
        assert want in header
    assert len(rows) == len(table)
    for row, (_, expected) in zip(rows, table.iterrows()):
        cell = dict(zip(header, row))
        assert cell["shape"] == expected["shape"] and cell["dtype"] == expected["dtype"]
        assert cell["config"].startswith("`{") and " " not in cell["config"], cell["config"]  # compact JSON
        assert json.loads(cell["config"].strip("`")) == expected["config"]
        assert cell["trials"] == str(expected["trials"]) and cell["measured"] == "False"
        assert float(cell["p20_us"]) == pytest.approx(expected["p20_us"], rel=1e-2)


def test_the_html_table_has_every_csv_column(table: pd.DataFrame, tmp_path: Path) -> None:
    page = write_report(table, tmp_path)["html"].read_text()
    heads = re.findall(r"<th>(.*?)</th>", page)
    assert heads == COLUMNS
    first = re.findall(r"<tr>(<td>.*?)</tr>", page)[0]
    cells = dict(zip(COLUMNS, re.findall(r"<td>(.*?)</td>", first)))
    assert cells["shape"] == "X[64x4096]" and cells["dtype"] == "float32" and cells["measured"] == "False"
    assert json.loads(html.unescape(cells["config"].removeprefix("<code>").removesuffix("</code>"))) == \
        table.loc[0, "config"]


def test_dollars_in_markdown_are_no_math(table: pd.DataFrame, tmp_path: Path) -> None:
    text = write_report(table, tmp_path)["markdown"].read_text()
    assert "| matmul:M=\\$M,N=\\$N,K=64 |" in text and "=$" not in text


def test_markdown_cells_stay_on_their_row() -> None:
    df = pd.DataFrame({"workload": ["two\nlines", "a|b"], "config": [{"k": "`x`"}, None]})
    lines = markdown_table(df).splitlines()
    assert len(lines) == 4, lines
    assert lines[2] == "| two lines | `` {\"k\":\"`x`\"} `` |" and lines[3] == "| a\\|b | n/a |", lines


def drawn_texts(figures: list[Any]) -> list[tuple[str, bool]]:
    """(what is shown, whether as mathtext) for every non-empty text of the figures, tick labels included.
    ``Text._preprocess_math`` is how matplotlib itself decides; there is no public spelling of it."""
    out = []
    for fig in figures:
        ticks = [t for ax in fig.axes for t in (*ax.get_xticklabels(), *ax.get_yticklabels())]  # set on asking
        for t in (*fig.findobj(Text), *ticks):
            if t.get_visible() and t.get_text():
                out.append(t._preprocess_math(t.get_text()))
    return out


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    kept: list[Any] = []
    monkeypatch.setattr(writers, "_figure_png", lambda fig: kept.append(fig) or "")
    return kept


def test_dollars_in_a_bar_chart_are_drawn_literally(table: pd.DataFrame, figures: list[Any]) -> None:
    writers.roofline_bars(table)
    texts = drawn_texts(figures)
    assert (DOLLARS, False) in texts, texts
    assert not any(math for _, math in texts), texts


def test_dollars_and_underscores_in_a_legend_are_drawn(figures: list[Any]) -> None:
    writers.convergence_plot({DOLLARS: [3.0, 2.0, 2.0], "_hidden": [4.0, 1.0], "price $5": [2.0]})
    texts = drawn_texts(figures)
    assert (DOLLARS, False) in texts and ("price $5", False) in texts, texts
    assert any(shown.strip() == "_hidden" for shown, _ in texts), texts  # "_..." labels are left out otherwise
    # the log axis's own tick labels are mathtext ($\mathdefault{10^{0}}$); nothing else may be
    assert not any(math for shown, math in texts if "mathdefault" not in shown), texts


def test_method_names_in_tick_labels_are_drawn_literally(figures: list[Any]) -> None:
    df = pd.DataFrame({"workload": ["w", "w"], "method": ["rule[$a$]", "search"], "pct_roofline": [50.0, 60.0]})
    writers.roofline_bars(df)
    texts = drawn_texts(figures)
    assert ("rule[$a$]", False) in texts, texts
