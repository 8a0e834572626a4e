"""CSV a spreadsheet opens as data: every pipebench CSV goes through `csv_table`.

A job label, a transform name or an override comes from the user's command line or configs,
and a cell that starts like a formula runs as one when the CSV is opened in Excel, LibreOffice
or Sheets. OWASP's CSV-injection rule: prefix such a cell with a single quote, which makes it
text. Numbers stay numbers: -3.5 is data, not a formula, and a quote would turn it into text.
"""

import csv
import re
from io import StringIO
from typing import Iterable, Mapping, Sequence

__all__ = ["csv_line", "csv_table", "csv_text", "safe_cell"]

# OWASP: a cell beginning with one of these starts a formula (=, +, -, @) or can hide one from
# view ahead of it (tab, carriage return).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# A plain number as Python writes one (sign, digits, point, exponent) or inf/nan: left as it is.
NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|nan)", re.IGNORECASE)
# What makes a spreadsheet read the rest of the cell as text.
TEXT_PREFIX = "'"


def safe_cell(value: object) -> object:
    """`value`, with a single quote in front if it is a string that a spreadsheet would run."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not NUMBER.fullmatch(value):
        return TEXT_PREFIX + value
    return value


def csv_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A header line, then one line a row, every cell made safe."""
    buffer = StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([safe_cell(cell) for cell in header])  # axis columns are override keys, the user's
    writer.writerows([safe_cell(cell) for cell in row] for row in rows)
    return buffer.getvalue()


def csv_line(row: Sequence[object]) -> str:
    """One line of cells made safe, for a file that is appended to a row at a time."""
    return csv_table(row, ())


def csv_text(rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> str:
    """`csv_table` of mappings: one column a key of `columns` (other keys left out, missing ones empty)."""
    return csv_table(columns, ([row.get(column) for column in columns] for row in rows))
