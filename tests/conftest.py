"""Which prerequisites of ``make test`` each test needs, and the order that lets the rest run first.

``make test`` builds its slow prerequisites behind the tests (``tests/prerequisites.py``). A test
needs a group when it is marked ``needs("group")``, or else when it lives in a folder of
``FOLDER_NEEDS``. Under ``make test`` the tests run sorted by the build order of what they need,
those that need nothing first, each module kept whole (module-scoped fixtures); a test waits for
its group before its fixtures are set up. Elsewhere the order is pytest's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.prerequisites import group_order, mark_quiet_tests_done, wait_for_group, wait_for_quiet_tests

# Every test in these folders starts the sealed cluster or runs a built image: the Go tools, the
# host packages and the images (``make tools host-packages images``).
FOLDER_NEEDS = {"e2e": "cluster", "images": "cluster"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(group): the group of make test's prerequisites (TEST_PREREQ_GROUPS) this test waits for",
    )
    config.addinivalue_line(
        "markers",
        "second_stream: make test runs it in a second pytest process beside the others (it starts a "
        "cluster of its own and mostly waits on it)",
    )


def needed_group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("needs")
    if marker is not None:
        return str(marker.args[0])
    parts = item.path.relative_to(item.config.rootpath).parts
    return FOLDER_NEEDS.get(parts[1]) if len(parts) > 2 and parts[0] == "tests" else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = group_order()
    if not order:
        return
    rank = {group: index + 1 for index, group in enumerate(order)}
    # A module's rank is its first test's, so that no module is split across the run.
    module_rank: dict[object, int] = {}
    for item in items:
        module_rank.setdefault(item.module, rank.get(needed_group(item) or "", 0))  # type: ignore[attr-defined]
    items.sort(key=lambda item: module_rank[item.module])  # type: ignore[attr-defined]  # stable


WAIT_PROBLEM = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Wait for the test's group outermost, before pytest-timeout starts the test's clock (a
    wait of many minutes is not the test's time), with output capture off so the progress shows."""
    group = needed_group(item)
    if group is not None:
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        capture = item.config.pluginmanager.get_plugin("capturemanager")

        def say(line: str) -> None:
            if reporter is None:
                return
            with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
                reporter.write_line(f"[prerequisites] {line}")

        mark_quiet_tests_done()
        wait_for_quiet_tests(say)
        if problem := wait_for_group(group, say):
            item.stash[WAIT_PROBLEM] = problem
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if problem := item.stash.get(WAIT_PROBLEM, None):
        pytest.fail(problem, pytrace=False)
