"""How `make test` shares the test files among its pytest-xdist workers (`--dist loadfile`).

A file is one unit of work: its module-scoped fixtures (a control plane, an operator) start once, on one
worker. xdist's own order is by the number of tests in a file, which puts the unit-test tables first and
can leave the one long file (the chaos run) to start last, on a worker that then works alone for minutes.
Here the longest file known goes first to a worker that is free, and a worker that is busy with a long
file is given the shortest one left as the one file it must hold in reserve (a worker runs its last test
only once it knows what comes next). The estimates only order the work: no test depends on them, and a
file missing from the table gets its directory's default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdist.scheduler import LoadFileScheduling

if TYPE_CHECKING:
    from xdist.workermanage import WorkerController

# Seconds each file took on a 2-core machine running two workers (the junit report of a `make test` run,
# summed per file, December 2026, on a loaded machine), rounded; a file not here takes its directory's
# default. The integration files start the processes they test.
ESTIMATED_SECONDS: dict[str, float] = {
    "tests/integration/test_cli.py": 330,
    "tests/integration/test_quickstart.py": 240,
    "tests/e2e/test_helm.py": 240,
    "tests/integration/test_demo.py": 180,
    "tests/integration/test_chaos.py": 160,
    "tests/integration/namespaced/test_observability.py": 140,
    "tests/integration/test_console.py": 140,
    "tests/integration/test_holds.py": 130,
    "tests/integration/test_operator.py": 120,
    "tests/integration/test_langgraph_agent.py": 120,
    "tests/integration/test_hostile_store.py": 110,
    "tests/integration/namespaced/test_archive.py": 110,
    "tests/integration/test_recovery.py": 110,
    "tests/integration/test_console_load.py": 100,
    "tests/integration/namespaced/test_api.py": 90,
    "tests/integration/test_console_decisions.py": 90,
    "tests/integration/test_compaction.py": 90,
    "tests/unit/test_deploy.py": 70,
    "tests/integration/namespaced/test_api_corpus.py": 40,
    "tests/integration/test_peering.py": 40,
    "tests/integration/test_langgraph_delta.py": 40,
    "tests/integration/test_control_plane.py": 30,
    "tests/integration/test_identity.py": 30,
    "tests/integration/namespaced/test_budgets.py": 30,
    "tests/integration/test_langgraph_state_store.py": 30,
    "tests/integration/test_langgraph_saver.py": 30,
    "tests/integration/test_console_proxy.py": 20,
    "tests/integration/namespaced/test_restart_safety.py": 20,
    "tests/integration/test_version_skew.py": 20,
    "tests/integration/test_state_store_worker.py": 20,
    "tests/integration/test_archive_retention.py": 20,
    "tests/integration/test_langgraph_forks.py": 20,
    "tests/integration/test_statestore_s3.py": 17,
    "tests/integration/test_collector.py": 16,
    "tests/unit/test_core_runs_simulation.py": 16,
    "tests/unit/test_architecture.py": 16,
    "tests/integration/test_store_principals.py": 14,
    "tests/integration/test_operator_cache.py": 6,
    "tests/integration/test_kubeapi.py": 2,
    "tests/integration/test_bundled_store_start.py": 1,
}
DEFAULT_SECONDS = {"tests/unit/": 2.0, "tests/integration/": 60.0, "tests/e2e/": 300.0}
# A worker whose tests still to run are estimated at least this long is busy: it gets the shortest file.
BUSY_SECONDS = 60.0


def estimate(path: str) -> float:
    """The estimated seconds of a test file (a path as xdist's node ids start, relative to the root)."""
    if path in ESTIMATED_SECONDS:
        return ESTIMATED_SECONDS[path]
    for directory, seconds in DEFAULT_SECONDS.items():
        if path.startswith(directory):
            return seconds
    return DEFAULT_SECONDS["tests/unit/"]


class LongestFileFirst(LoadFileScheduling):  # type: ignore[misc]  # xdist ships no type information
    """`--dist loadfile`, handing out the longest file to a free worker and the shortest to a busy one."""

    def _remaining_seconds(self, node: WorkerController) -> float:
        remaining = 0.0
        for scope, tests in self.assigned_work.get(node, {}).items():
            left = sum(1 for done in tests.values() if not done)
            remaining += estimate(scope) * left / max(len(tests), 1)
        return remaining

    def _assign_work_unit(self, node: WorkerController) -> None:
        assert self.workqueue
        pick = min if self._remaining_seconds(node) >= BUSY_SECONDS else max
        scope = pick(self.workqueue, key=estimate)
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])
