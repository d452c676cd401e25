"""Comparison reports: rule vs carver vs search vs the vendor library, in pandas, CSV, Markdown and HTML."""

from schedlib.report.compare import COLUMNS, METHODS, compare
from schedlib.report.selfcheck import tensor_core_selfcheck
from schedlib.report.stats import Work, work
from schedlib.report.writers import markdown_table, write_report

__all__ = ["COLUMNS", "METHODS", "Work", "compare", "markdown_table", "tensor_core_selfcheck", "work",
           "write_report"]
