"""Every ``docs/NAME.md#anchor`` the code and the docs cite names a heading of that file, so a derivation moved out
of a docstring (issue 38) stays findable from the line it explains."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CITE = re.compile(r"docs/([\w/.-]+\.md)#([\w-]+)")


def slugs(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces as hyphens, a repeated
    heading suffixed -1, -2."""
    out: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6} +(.*?) *#* *$", line)
        if not m:
            continue
        base = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        slug, n = base, 0
        while slug in out:
            n += 1
            slug = f"{base}-{n}"
        out.add(slug)
    return out


def citations() -> list[tuple[str, str, str]]:
    """(where, doc, anchor) for each anchored docs link in launcher/, tests/, benchmarks/, scripts/ and the docs."""
    files = [p for d in ("launcher", "tests", "benchmarks", "scripts") for p in (REPO / d).rglob("*.py")
             if p != Path(__file__).resolve()]
    files += [*(REPO / "docs").rglob("*.md"), REPO / "README.md"]
    out = []
    for path in files:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            out += [(f"{path.relative_to(REPO)}:{i}", doc, anchor) for doc, anchor in CITE.findall(line)]
    return out


def test_every_cited_anchor_is_a_heading():
    cited = citations()
    assert any(doc == "memory-model.md" for _, doc, _ in cited)
    missing = [f"{where}: docs/{doc}#{anchor}" for where, doc, anchor in cited
               if not (REPO / "docs" / doc).is_file() or anchor not in slugs((REPO / "docs" / doc).read_text())]
    assert missing == []


def test_slugs_follow_github():
    md = "# The memory model: why\n## Selective (`checkpoint_every`)\n```\n# not a heading\n```\n## Selective (`x`)\n"
    assert slugs(md) == {"the-memory-model-why", "selective-checkpoint_every", "selective-x"}
    assert slugs("## A\n## A\n") == {"a", "a-1"}
