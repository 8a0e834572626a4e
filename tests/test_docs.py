"""The docs keep up with the code: every summary.csv column is documented, and the README stays short
with links that resolve."""

import re
from pathlib import Path

from pipebench.record.results import SUMMARY_COLUMNS

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SCHEMA = REPO / "docs" / "results-schema.md"
README_MAX_LINES = 200
# A markdown link's target: [text](target) or [text](target#anchor).
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def test_every_summary_column_is_in_the_results_schema():
    text = SCHEMA.read_text()
    missing = [name for name in SUMMARY_COLUMNS if f"`{name}`" not in text]
    assert not missing, f"docs/results-schema.md does not list: {missing}"


def test_readme_links_to_docs_resolve_and_readme_is_short():
    text = README.read_text()
    targets = [t for t in LINK.findall(text) if "://" not in t]
    doc_links = [t for t in targets if re.fullmatch(r"(\./)?docs/[^/]+\.md", t)]
    assert doc_links, "README.md links to no page under docs/"
    broken = [t for t in doc_links if not (REPO / t).is_file()]
    assert not broken, f"README.md links to missing pages: {broken}"
    lines = len(text.splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; keep it to {README_MAX_LINES}"
