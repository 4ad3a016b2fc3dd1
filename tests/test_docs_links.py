"""The docs hold together: every relative link in README.md, BENCHMARKS.md, CHANGELOG.md, SECURITY.md
and docs/ resolves to a file, and every #anchor to a heading of it; README.md stays at most 10 KB.

Pages other engineers are writing in parallel are linked from the docs index before they exist in
every branch: a link to one of ``PENDING`` may be missing; once the page exists it is checked like
any other (its own links too, since every file under docs/ is read).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("README.md", "BENCHMARKS.md", "CHANGELOG.md", "SECURITY.md")
PENDING = frozenset(
    {
        "docs/integrations/otlp.md",
        "docs/integrations/mcp.md",
        "docs/integrations/parquet.md",
        "docs/integrations/metrics.md",
        "docs/concepts/advise.md",
        "docs/concepts/rhythms.md",
        "docs/concepts/sleep.md",
        "docs/design/forget.md",
    }
)

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.

    >>> slug("The commit that hung (`streams/kafka_compat.py`, `track_topics_sent_to`)")
    'the-commit-that-hung-streamskafka_compatpy-track_topics_sent_to'
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    found = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        found += _LINK.findall(_CODE_SPAN.sub("", line))
    return found


def broken_links(root: Path, files: list[Path], pending: frozenset[str] = frozenset()) -> list[str]:
    """Each relative link of ``files`` that names no file or no heading, as ``file: target (why)``."""
    problems = []
    for path in files:
        for target in links(path):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            ref, _, anchor = target.partition("#")
            dest = (path.parent / ref).resolve() if ref else path
            name = path.relative_to(root)
            if not dest.exists():
                rel = dest.relative_to(root).as_posix() if dest.is_relative_to(root) else str(dest)
                if rel not in pending:
                    problems.append(f"{name}: {target} (no such file)")
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{name}: {target} (no heading #{anchor})")
    return problems


def doc_files(root: Path) -> list[Path]:
    return [root / f for f in TOP_LEVEL if (root / f).exists()] + sorted((root / "docs").rglob("*.md"))


def test_every_relative_link_resolves() -> None:
    assert broken_links(ROOT, doc_files(ROOT), PENDING) == []


def test_a_broken_link_or_anchor_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Its part\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [ok](docs/a.md#its-part) [gone](docs/b.md) [bad](docs/a.md#nothing)\n"
        "`[in code](docs/c.md)` [web](https://example.com) [soon](docs/d.md)\n"
        "```\n[fenced](docs/e.md)\n```\n"
    )
    got = broken_links(tmp_path, doc_files(tmp_path), frozenset({"docs/d.md"}))
    assert got == ["README.md: docs/b.md (no such file)", "README.md: docs/a.md#nothing (no heading #nothing)"]


def test_pending_pages_are_linked_from_the_docs_index() -> None:
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve().relative_to(ROOT).as_posix() for t in links(index)}
    assert PENDING <= linked


def test_readme_is_at_most_10_kb() -> None:
    assert (ROOT / "README.md").stat().st_size <= 10 * 1024


@pytest.mark.parametrize("command", ["demo", "test"])
def test_readme_commands_are_run_sh_commands(command: str) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"bash run.sh {command}" in readme
    assert re.search(rf"^\s*{command}\)", (ROOT / "run.sh").read_text(encoding="utf-8"), re.M)
