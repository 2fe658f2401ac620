"""The docs site builds in strict mode (`make docs`, scripts/docs.py): a broken link between
pages, or to an anchor of a page, fails `make test`. A unit test: mkdocs only, no process of
ours (a build takes a few seconds)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_script", ROOT / "scripts" / "docs.py")
docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs)


def test_the_site_builds_strict_with_the_readme_as_home(tmp_path):
    done = docs.build(tmp_path / "site")
    assert done.returncode == 0, done.stdout
    home = (tmp_path / "site" / "index.html").read_text()
    assert "Quickstart" in home and 'href="CLI/"' in home   # docs/CLI.md links, rewritten
    for page in ("CLI", "CLIENT", "SHADOWS", "COMPACTION", "OPERATIONS", "ARCHITECTURE",
                 "BEHAVIOURS", "DEPLOYMENT", "CHAOS", "DESIGN-NOTES", "DEVELOPMENT"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    for i, broken in enumerate(["[gone](NOWHERE.md)", "[gone](ARCHITECTURE.md#no-such-part)"]):
        staged = tmp_path / str(i)
        staged.mkdir()
        config = docs.stage(staged, staged / "site")
        page = staged / "docs" / "CLI.md"
        page.write_text(page.read_text() + f"\n{broken}\n")
        done = docs.run_mkdocs(config)
        assert done.returncode != 0, broken
        assert "CLI.md" in done.stdout, done.stdout


def test_a_page_missing_from_the_nav_gets_a_place_in_it():
    nav = [{"Home": "index.md"}, {"Use": [{"Command line": "CLI.md"}]}]
    assert docs.complete_nav(nav, ["CLI.md", "index.md"]) == nav
    assert docs.complete_nav(nav, ["CLI.md", "NEW.md", "index.md"]) == [*nav, {"More": ["NEW.md"]}]
