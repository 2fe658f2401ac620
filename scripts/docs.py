"""Render the docs site (`make docs`): docs/ with the README as its home page, by mkdocs in
strict mode, so a broken link between pages, or to an anchor, fails the build.

Why a script: the config lives in docs/mkdocs.yml (the repo's top level is fixed), and mkdocs
refuses a docs_dir that holds its own config file; the home page is README.md, whose links
say `docs/CLI.md`. So this stages a copy of docs/ in a temp dir, writes README.md there as
index.md with `](docs/` links made `](`, writes the effective config beside it (docs_dir: the
staged copy; site_dir: build/site unless --site-dir; pages docs/mkdocs.yml's nav does not
list yet under "More") and runs `mkdocs build --strict` on it.

    python scripts/docs.py [--site-dir DIR]      # exit code: mkdocs's
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def home_page(readme: str) -> str:
    """The README as the site's index.md: its links into docs/ point at the pages beside it."""
    return re.sub(r"\]\(docs/", "](", readme)


def nav_pages(nav) -> set[str]:
    """The page files a mkdocs nav lists (nested sections included)."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(nav_pages(v) for v in nav.values()))
    return set().union(*(nav_pages(v) for v in nav)) if nav else set()


def complete_nav(nav: list, pages: list[str]) -> list:
    """`nav` with the pages it does not list under "More": a page added to docs/ and not yet
    to the nav still gets a place in it."""
    unlisted = sorted(set(pages) - nav_pages(nav))
    return [*nav, {"More": unlisted}] if unlisted else nav


def stage(into: Path, site_dir: Path) -> Path:
    """Stage docs/ and the home page under `into`; return the effective config's path."""
    docs = into / "docs"
    shutil.copytree(DOCS, docs)
    (docs / "index.md").write_text(home_page((ROOT / "README.md").read_text()))
    config = yaml.safe_load((DOCS / "mkdocs.yml").read_text())
    config.update(docs_dir=str(docs), site_dir=str(site_dir))
    config["nav"] = complete_nav(config["nav"], [p.name for p in DOCS.glob("*.md")])
    path = into / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_mkdocs(config: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` on a staged config; output captured (stdout and stderr)."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
                           "-f", str(config)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)


def build(site_dir: Path) -> subprocess.CompletedProcess:
    """Stage and build into `site_dir`."""
    with tempfile.TemporaryDirectory(prefix="shadowtopic-docs-") as tmp:
        return run_mkdocs(stage(Path(tmp), site_dir))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site-dir", type=Path, default=ROOT / "build" / "site")
    args = parser.parse_args()
    done = build(args.site_dir.resolve())
    sys.stdout.write(done.stdout)
    if done.returncode == 0:
        print(f"site: {args.site_dir}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
