"""Which prerequisites of ``make test`` each test needs, and the order that lets the rest run first.

``make test`` builds its slow prerequisites behind the tests (``tests/prerequisites.py``). A test
needs a group when it is marked ``needs("group")``, or else when it lives in a folder of
``FOLDER_NEEDS``. Under ``make test`` the tests run sorted by the build order of what they need,
those that need nothing first, each module kept whole (module-scoped fixtures); a test waits for
its group before its fixtures are set up. Elsewhere the order is pytest's own.

Under make test two pytest processes run side by side (hack/test-behind-prerequisites.sh): the
main stream, with every test not marked ``second_stream``, and the second, with those marked
``second_stream`` (each starts a cluster of its own). The modules that need a prerequisite and are
not marked are shared: both streams collect them, the main stream from the front, the second from
the back once its own are done (group by group, the earliest built first), and whichever reaches
a module first runs it (``claim_module``), so the streams end together however long each module
takes on the machine at hand.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import pytest

from tests.prerequisites import (
    claim_module,
    group_order,
    mark_quiet_tests_done,
    second_stream,
    wait_for_group,
    wait_for_quiet_tests,
)

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
    if second_stream():
        own: list[pytest.Item] = []
        shared_modules: list[list[pytest.Item]] = []
        quiet: list[pytest.Item] = []
        for tests in by_module(items):
            if tests[0].get_closest_marker("second_stream"):
                own += tests
            elif shared(tests[0]):
                shared_modules.append(tests)
            else:
                quiet += tests
        # From the back, but those of a group built earlier first: on a fresh machine the second
        # stream should not wait for skaffold's compile while modules that need only the cluster
        # are left.
        shared_modules.reverse()
        shared_modules.sort(key=lambda tests: module_rank[tests[0].module])  # type: ignore[attr-defined]
        items[:] = own + [item for tests in shared_modules for item in tests]
        if quiet:
            config.hook.pytest_deselected(items=quiet)


def by_module(items: list[pytest.Item]) -> list[list[pytest.Item]]:
    """The tests in runs of one module each (the order makes each module one run)."""
    return [list(tests) for _, tests in itertools.groupby(items, key=module_id)]


def module_id(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def shared(item: pytest.Item) -> bool:
    """Whether both streams of make test collect the test (see the module doc)."""
    return needed_group(item) is not None and item.get_closest_marker("second_stream") is None


OTHER_STREAM = pytest.StashKey[list[str]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """pytest's own loop, leaving out the shared modules that the other stream of make test claimed
    first; elsewhere (or on collection errors, or ``--collect-only``) pytest's own loop runs."""
    config = session.config
    if not group_order() or config.option.collectonly or session.testsfailed:
        return None
    left_out = config.stash.setdefault(OTHER_STREAM, [])

    def claimed() -> Iterator[pytest.Item]:
        for module_tests in by_module(session.items):
            module = module_id(module_tests[0])
            if shared(module_tests[0]) and not claim_module(module):
                left_out.append(module)
                config.hook.pytest_deselected(items=module_tests)
                continue
            yield from module_tests

    # The next test is known before this one runs (module-scoped fixtures end on it), so a module
    # is claimed while the last test of the module before it runs.
    queue = claimed()
    item = next(queue, None)
    while item is not None:
        nextitem = next(queue, None)
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        item = nextitem
    return True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if left_out := terminalreporter.config.stash.get(OTHER_STREAM, []):
        count = f"{len(left_out)} shared module{'s' if len(left_out) != 1 else ''}"
        terminalreporter.write_line(f"the other stream of make test ran {count}:")
        for module in left_out:
            terminalreporter.write_line(f"  {module}")


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
