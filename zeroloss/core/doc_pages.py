"""Where an error or a check's hint sends its reader: a page of the zeroloss documentation named
by its place in the site's navigation (mkdocs.yml), never by a path in the repository, which a
project that installed the package does not have. The hint itself states the fix; the page is
where the why is. tests/unit/test_doc_pages.py holds each title to the navigation.
"""

from __future__ import annotations

#: Page key -> "Section > Title", as the documentation's navigation shows it.
PAGES: dict[str, str] = {
    "celery": "Guides > Celery",
    "control": "Guides > Control: pause, limits, cancel, time limits",
    "schedules": "Guides > Periodic messages",
    "testing": "Guides > Testing your handlers",
    "production": "Operating > Production",
    "replication": "Operating > Replication",
    "scaling": "Design > Scaling",
    "benchmarks": "Design > Benchmarks",
}


def see(page: str, section: str = "") -> str:
    """``zeroloss documentation: Guides > Periodic messages`` (and ``, "Section"``)."""
    where = f"zeroloss documentation: {PAGES[page]}"
    return f'{where}, section "{section}"' if section else where
