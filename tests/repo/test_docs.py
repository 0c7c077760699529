"""The documentation points at things that exist: relative links (and their #anchors), repository paths, module
paths, ``harness`` subcommands and ``python -m`` / ``python bench/…`` commands named in README.md and docs/.

Docs were rewritten when the code moved into layers; a path that no longer exists is a reader's dead end, so a
rename must carry the docs with it. Reads files only (no training, no model import), so it is fast.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TOP_DIRS = ("harness", "analysis", "data_recipes", "bench", "tests", "experiments", "docs")
PLACEHOLDER = re.compile(r"[<>*…]|\bNAME\b|\bFILE\b|\bDIR\b|\bRUN_DIR\b|\bCHECKPOINT\b|XXXX")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", text, re.M)}


def _code_spans(text: str) -> list[str]:
    """Inline code spans and the lines of fenced blocks."""
    spans = [m.group(1) for m in CODE.finditer(FENCE.sub("", text))]
    for block in FENCE.finditer(text):
        spans.extend(block.group(1).splitlines())
    return spans


def _module_file(dotted: str) -> Path | None:
    """The file of the longest importable prefix of ``dotted`` that is a module or package, with the rest as
    attribute names; None when no prefix is a module."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.exists():
                return candidate if cut == len(parts) or _defines(candidate, parts[cut]) else None
    return None


def _defines(module: Path, name: str) -> bool:
    """``name`` is defined, assigned or imported in ``module`` (a word-level check: enough to catch a rename)."""
    if module.name == "__init__.py" and (module.parent / name).is_dir():
        return True
    return re.search(rf"\b{re.escape(name)}\b", module.read_text()) is not None


def _cli_commands() -> dict[str, set[str]]:
    """``{"run": {"--out", …}, "cache prune": {…}, …}``: every subcommand of the ``harness`` app and its options
    (the typer app itself, read through click; importing it loads no model code)."""
    import importlib

    import typer.main

    app = typer.main.get_command(importlib.import_module("harness.cli.app").app)
    found = {}
    for name, command in app.commands.items():
        found[name] = {opt for param in command.params for opt in param.opts if opt.startswith("--")}
        for sub_name, sub in getattr(command, "commands", {}).items():
            found[f"{name} {sub_name}"] = {opt for param in sub.params for opt in param.opts if opt.startswith("--")}
    return found


GLOBAL_OPTIONS = {"--debug", "--help"}  # --debug is read anywhere on the command line (harness.cli.errors)
COMMAND_LINE = re.compile(r"(?:^\$?\s*|-m )harness ([a-z][\w-]*)(?: (ls|du|prune)\b)?(.*)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_modules_and_commands_exist(page):
    missing = []
    commands = _cli_commands()
    for span in _code_spans(page.read_text()):
        for word in re.findall(r"[\w./\-]+", span):
            word = word.rstrip(".,;:")
            if word.split("/")[0] in TOP_DIRS and "/" in word:
                if not PLACEHOLDER.search(word) and not (ROOT / word).exists():
                    missing.append(f"path {word}")
            elif re.fullmatch(r"(harness|analysis|data_recipes)(\.\w+)+", word) and _module_file(word) is None:
                missing.append(f"module {word}")
        # a command line: `harness SUB …`, `$ harness SUB …`, `python -m harness SUB …`, `torchrun … -m harness SUB`
        line = COMMAND_LINE.search(span.strip())
        if line:
            sub = " ".join(filter(None, line.group(1, 2)))
            if sub not in commands:
                missing.append(f"command harness {sub}")
                continue
            rest = line.group(3).split("#")[0]
            missing.extend(
                f"option harness {sub} {opt}"
                for opt in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)
                if opt not in commands[sub] | GLOBAL_OPTIONS
            )
    assert not missing, sorted(set(missing))


def test_the_checker_finds_a_planted_dead_end(tmp_path):
    """The checks above are not vacuous: a page naming a missing file, module, anchor and subcommand fails them."""
    page = tmp_path / "docs" / "bad.md"
    page.parent.mkdir()
    page.write_text(
        "# Title\n\n[gone](nowhere.md) [anchor](#no-such) `harness/runs/missing.py` "
        "`harness.runs.nothing_here` `harness frobnicate` `harness run FILE --no-such-flag`\n"
    )
    with pytest.raises(AssertionError) as links:
        test_relative_links_and_anchors_resolve(page)
    assert "nowhere.md" in str(links.value) and "#no-such" in str(links.value)
    with pytest.raises(AssertionError) as names:
        test_named_paths_modules_and_commands_exist(page)
    for needle in ("harness/runs/missing.py", "harness.runs.nothing_here", "harness frobnicate", "--no-such-flag"):
        assert needle in str(names.value)


def test_every_docs_page_is_reachable_from_the_readme():
    """A page no link leads to is a page no reader finds: every docs/ page is reachable from README.md by links."""
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop().resolve()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        todo.extend(
            page.parent / t.partition("#")[0]
            for t in LINK.findall(page.read_text())
            if not re.match(r"[a-z]+:", t) and t.partition("#")[0]
        )
    unreachable = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md")) if p.resolve() not in seen]
    assert not unreachable, unreachable
