"""The docs keep up with the code: every summary.csv and transforms.csv column is documented, and the
README stays short with links that resolve."""

import re
from pathlib import Path

from pipebench.record.figures import SUMMARY_TABLE
from pipebench.record.results import TRANSFORM_COLUMNS

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SCHEMA = REPO / "docs" / "results-schema.md"
README_MAX_LINES = 200
# A markdown link's target: [text](target) or [text](target#anchor).
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")
# A results-schema table row: | `column` | unit | meaning |
SUMMARY_ROW = re.compile(r"\| `(\w+)` \| ([^|]*) \|")


def test_every_transform_column_is_in_the_results_schema():
    text = SCHEMA.read_text()
    missing = [name for name in TRANSFORM_COLUMNS if f"`{name}`" not in text]
    assert not missing, f"docs/results-schema.md does not list: {missing}"


def test_summary_section_lists_the_column_table_in_order():
    """summary.csv's section holds one row a column of SUMMARY_TABLE, in its order, under its section and with
    its unit."""
    part = SCHEMA.read_text().split("## summary.csv", 1)[1].split("## transforms.csv", 1)[0]
    documented, section = [], None
    for line in part.splitlines():
        section = line[4:].strip() if line.startswith("### ") else section
        row = SUMMARY_ROW.match(line)
        if row:
            documented.append((row[1], row[2].strip(), section))
    assert documented == [(c.name, c.unit, c.section) for c in SUMMARY_TABLE]


def test_readme_links_to_docs_resolve_and_readme_is_short():
    text = README.read_text()
    targets = [t for t in LINK.findall(text) if "://" not in t]
    doc_links = [t for t in targets if re.fullmatch(r"(\./)?docs/[^/]+\.md", t)]
    assert doc_links, "README.md links to no page under docs/"
    broken = [t for t in doc_links if not (REPO / t).is_file()]
    assert not broken, f"README.md links to missing pages: {broken}"
    lines = len(text.splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; keep it to {README_MAX_LINES}"


LAYOUT = REPO / "docs" / "layout.md"
# Where a module's own source says why: a file in the repository, never one outside it.
OUTSIDE_CITATION = re.compile(r"DESIGN(\.md)? ?§")


def _row_of(text: str, path: str) -> str:
    """The layout table's row whose first cell is `path`, '' when there is none."""
    return next((line for line in text.splitlines() if line.startswith(f"| `{path}`")), "")


def test_layout_names_every_module_in_its_subpackage_row():
    """Each engine module is named (as `module`) in its subpackage's row; each catalogue module by path."""
    text = LAYOUT.read_text()
    missing = []
    for module in sorted((REPO / "pipebench").rglob("*.py")):
        folder = module.parent.relative_to(REPO).as_posix()
        if module.name == "__init__.py" or folder == "pipebench":
            continue
        if f"`{module.stem}`" not in _row_of(text, f"{folder}/"):
            missing.append(module.relative_to(REPO).as_posix())
    for catalogue in ("datasets", "transforms"):
        missing += [f"{catalogue}/{m.name}" for m in sorted((REPO / catalogue).glob("*.py"))
                    if m.name != "__init__.py" and f"`{catalogue}/{m.name}`" not in text]
    assert not missing, f"docs/layout.md does not name: {missing}"


def test_no_code_cites_a_design_file_outside_the_repository():
    cited = [f"{path.relative_to(REPO)}:{n}" for folder in ("pipebench", "datasets", "transforms", "tests",
                                                            "benchmarks", "hydra_plugins")
             for path in sorted((REPO / folder).rglob("*.py")) if "conf" not in path.parts
             for n, line in enumerate(path.read_text().splitlines(), 1) if OUTSIDE_CITATION.search(line)]
    assert not cited, f"cite the docs page that holds the reason instead: {cited}"
