"""MkDocs hooks for the documentation site (``mkdocs.yml``; ``make docs``).

The pages are written to read on GitHub too: the README, ``CHANGELOG.md`` and ``CONTRIBUTING.md``
live at the repository's root and the pages link to them as ``../README.md``. These hooks add
those files as pages of the site (``readme.md``, ``changelog.md``, ``contributing.md``) and point those links, and the root files'
own ``docs/...`` links, at the site's pages. The reference's "System checks" page is
``docs/settings.md``'s section of that name, published on its own (the table stays written once);
mkdocstrings' rendering of the docstrings' reST
roles (``:class:`~a.B```) is reduced to the code it names.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent
#: Root files published as pages: repository path -> page path.
ROOT_PAGES = {
    "README.md": "readme.md",
    "CHANGELOG.md": "changelog.md",
    "CONTRIBUTING.md": "contributing.md",
}

#: Pages made of one section of another page: page path -> (source page, its section's heading).
SECTION_PAGES = {"checks.md": ("settings.md", "## System checks")}

_ROOT_LINK = re.compile(r"\]\((?:\.\./)+(README|CHANGELOG|CONTRIBUTING)\.md(#[^)]*)?\)")
_DOCS_LINK = re.compile(r"\]\(docs/([^)]*)\)")
_ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj):(<code>)~?(?:[\w.]+\.)?")


def on_files(files: Files, config: Any) -> Files:
    for source, page in ROOT_PAGES.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        # The root files link into docs/; on the site they sit beside those pages.
        text = _DOCS_LINK.sub(r"](\1)", text)
        for other, other_page in ROOT_PAGES.items():
            text = text.replace(f"]({other}", f"]({other_page}")
        files.append(File.generated(config, page, content=text))
    for page, (source, heading) in SECTION_PAGES.items():
        text = (ROOT / "docs" / source).read_text(encoding="utf-8")
        body = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
        title = heading.removeprefix("## ")
        # Links into the source page's other sections still point at it.
        body = re.sub(r"\]\(#", f"]({source}#", body)
        intro = f"From [{source.removesuffix('.md')}]({source}#{title.lower().replace(' ', '-')}).\n"
        files.append(File.generated(config, page, content=f"# {title}\n\n{intro}{body}"))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return _ROOT_LINK.sub(lambda m: f"]({ROOT_PAGES[m.group(1) + '.md']}{m.group(2) or ''})", markdown)


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri.startswith("reference/"):
        html = _ROLE.sub(r"\1", html)
    return html
