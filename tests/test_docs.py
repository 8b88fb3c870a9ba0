"""The documentation holds together: links resolve, the README stays short and starts with the two
commands, every command and option of the real CLI is in docs/cli.md, every benchmark section says what
it measures against what, and the wording is about the product (dates and commits), not about how the
work was organised."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a '# comment' in a shell block is not a heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, punctuation removed, spaces to '-'."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[*_]{1,2}([^*_]+)[*_]{1,2}", r"\1", text)
    text = text.strip().lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(page: Path) -> list[str]:
    found = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        for match in LINK.finditer(line):
            found.append(match.group(1) or match.group(2))
    return found


def test_readme_is_at_most_300_lines_and_opens_with_make_demo_then_make_test():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300, f"README.md has {len(text.splitlines())} lines; at most 300"
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README.md needs its commands in a ```bash block up front"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands[:2] == ["make demo", "make test"], commands
    assert text.index(block.group(0)) < text.index("\n## "), "the two commands come before the first section"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_points_at_an_existing_file_and_heading(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(REPO)}")
    assert not broken, "broken links in " + page.name + ":\n" + "\n".join(broken)


ORDINALS = ("first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth "
            "fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth").split()
ORGANISATION = [
    re.compile(r"\bsessions?\b", re.I),
    re.compile(r"\battempts?\b", re.I),
    re.compile(r"\b(" + "|".join(ORDINALS) + r")\s+(run|try|search|call)s?\b", re.I),
    re.compile(r"\b\d+(st|nd|rd|th)\s+(session|run|try|attempt|search)\b", re.I),
]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_docs_speak_of_dates_and_commits_not_of_how_the_work_was_organised(page):
    hits = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for pattern in ORGANISATION:
            for match in pattern.finditer(line):
                hits.append(f"{page.name}:{number}: '{match.group(0)}' in: {line.strip()[:120]}")
    assert not hits, "\n".join(hits)


def cli_commands():
    """(command path, [option and argument names]) for every command of the real CLI."""
    import typer

    from mazerl.cli import app

    root = typer.main.get_command(app)
    found = []

    def walk(command, path):
        names = []
        for param in command.params:
            if type(param).__name__ == "TyperArgument":
                names.append(param.name.upper())
            else:
                names.extend(param.opts + param.secondary_opts)
        found.append((" ".join(path), names, (command.help or "").strip().splitlines()[0:1]))
        for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
            walk(sub, [*path, name])

    walk(root, ["mazerl"])
    return found


def cli_md_sections() -> dict[str, str]:
    """docs/cli.md's text under each '## mazerl ...' / '### mazerl ...' heading, up to the next heading."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in prose_lines((REPO / "docs" / "cli.md").read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match and len(match.group(1)) <= 3:
            title = match.group(2).strip("` ")
            current = title if title.startswith("mazerl") else None
            if current is not None:
                sections[current] = []
            continue
        if current is not None:
            sections[current].append(line)
    return {title: "\n".join(body) for title, body in sections.items()}


def test_docs_cli_md_has_every_command_and_every_option_of_the_real_cli():
    sections = cli_md_sections()
    commands = cli_commands()
    missing = []
    for path, names, summary in commands:
        if path not in sections:
            missing.append(f"no section '{path}' (a '## {path}' or '### {path}' heading; the command says: "
                           f"{' '.join(summary)!r}; options: {', '.join(names)})")
            continue
        for name in names:
            if f"`{name}" not in sections[path] and f" {name}" not in sections[path]:
                missing.append(f"{path}: option or argument {name} not listed")
    assert not missing, ("docs/cli.md is behind the CLI (list options as `mazerl ... --help` prints "
                         "them):\n" + "\n".join(missing))
    stale = sorted(set(sections) - {path for path, _, _ in commands})
    assert not stale, f"docs/cli.md documents commands the CLI does not have: {stale}"


def benchmark_sections() -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in prose_lines((REPO / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match and len(match.group(1)) == 2:
            current = match.group(2)
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {title: "\n".join(body) for title, body in sections.items()}


def test_every_benchmark_section_says_what_it_measures_its_command_latest_figures_and_anchor():
    sections = benchmark_sections()
    assert len(sections) >= 15, sorted(sections)
    lacking = []
    for title, body in sections.items():
        for field in ("**Measures**", "**Command**", "**Latest**", "**Anchor**"):
            if field not in body:
                lacking.append(f"{title}: no {field}")
        latest = body.split("**Latest**", 1)[-1]
        if "pending" not in latest.split("\n\n", 1)[0] and not re.search(r"20\d\d-\d\d-\d\d", latest):
            lacking.append(f"{title}: latest figures without a date")
    assert not lacking, "\n".join(lacking)


def test_the_github_slug_matches_githubs_rules_for_the_headings_used_here():
    assert github_slug("What `make demo` prints") == "what-make-demo-prints"
    assert github_slug("Errors, exit codes and what is never lost") == "errors-exit-codes-and-what-is-never-lost"
    assert github_slug("The local pipeline run (`make demo`)") == "the-local-pipeline-run-make-demo"
    assert github_slug("2026-12-01: tiny-base rebuilt") == "2026-12-01-tiny-base-rebuilt"
