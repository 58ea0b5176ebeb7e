"""The slow tier, by folder: every test under one of these folders is marked ``slow`` here, and
nowhere else (``./scripts/test --quick`` deselects them). tests/README.md says why each is slow."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
SLOW_FOLDERS = tuple(HERE / name for name in (
    "e2e",              # whole experiments, kills of real runs
    "containers",       # a real Docker daemon
    "thirdparty",       # nginx, HAProxy, transformers serve, LiteLLM
    "vllm",             # real vLLM
    "llamacpp",         # real llama.cpp (llama-server) and whole runs against it
    "k8s/runs",         # whole runs against the fake API server
    "stack/processes",  # a stack process per case, or killed ones
    "reports/runs",     # real runs the report pages are made from
    "hops/runs",        # stream hop and gateway processes in front of a real stack
    "survival/runs",    # the stream-survival matrix through real gateways
    "lint",             # mypy over the packages, the suite's worker grouping
    "install/light",    # a fresh virtualenv with the light install
))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if any(folder in path.parents for folder in SLOW_FOLDERS):
            item.add_marker(pytest.mark.slow)


# What one xdist worker runs as a unit (``--dist loadgroup``, as ./scripts/test runs), by node-id
# prefix. xdist_group marks were meant to say this, but xdist 3.8 writes the group into
# ``Item._nodeid``, which pytest 9 no longer reads: the marks did nothing, and the vLLM tier's three
# runs started together on the two cores. The scheduler below groups by this table instead.
ONE_WORKER: tuple[tuple[str, str], ...] = (
    # real vLLM, built by each run (three processes, each importing vLLM): two at once starve both
    ("tests/vllm/", "vllm"),
    ("tests/e2e/test_budgets_real.py", "vllm"),  # compares runs minutes apart: never beside vLLM
    # a module- or session-scoped server, site or library, built once and not once per worker (2-5 s
    # of CPU each; the quick tier: 159 s without these groups, 139 s with the modules' alone)
    ("tests/llamacpp/", "llamacpp"),  # the module's llama-server processes, started once per set of flags
    ("tests/stack/test_", "stack"),  # the stack servers of tests/stack/conftest.py (not processes/)
    ("tests/toxiproxy/", "toxiproxy"),  # the embedded Toxiproxy and its upstreams
    ("tests/k8s/", "k8s"),  # the fake API server
    ("tests/integrations/test_otel.py", "otel"),  # the module's builtin stack
    ("tests/integrations/test_chaostoolkit.py", "chaostoolkit"),  # its builtin stack and CTK run of the storm
    ("tests/test_docs_site.py", "docs-site"),
    ("tests/engine/test_export.py", "engine-export"),
    ("tests/faults/test_server_faults.py", "server-faults"),
    ("tests/faults/test_kv.py", "faults-kv"),
    ("tests/stack/processes/test_kv_prefix_flush.py", "faults-kv-prefix-flush"),
    ("tests/stack/processes/test_long_context.py", "engine-long-context"),
    ("tests/load/test_prompt_tokens.py", "prompt-tokens"),
    # a module-scoped process, library or run, used by several tests of one module: each worker that ran
    # one of them built it again (report probes' three runs: 31 s of setup on each of three workers in CI).
    # lint/test_suite_groups.py fails on a module with such a fixture that is missing here
    ("tests/test_capped.py", "capped"),
    ("tests/faults/test_gpu.py", "faults-gpu"),
    ("tests/nvml/", "nvml"),
    ("tests/reports/test_report_page.py", "report-page"),
    ("tests/test_failed_runs.py", "failed-runs"),
    ("tests/reports/test_result_formats.py", "result-formats"),  # one run read in each format
    ("tests/reports/test_grafana_annotations.py", "grafana"),  # one run, one annotations receiver
    ("tests/fleet/test_clients.py", "fleet-clients"),  # one Prometheus, Alertmanager and nginx
    ("tests/fleet/test_lever.py", "fleet-lever"),  # the fake API server
    ("tests/fleet/test_stop_when.py", "fleet-stop-when"),  # a stack, a Prometheus scraping it, an Alertmanager
    # the slow tier's: queued first among the slow tests (_QueueOrder), not beside vLLM
    ("tests/reports/runs/test_probe_runs.py", "probe-runs"),
    ("tests/thirdparty/test_nginx.py", "thirdparty-stack"),  # tests/thirdparty/conftest.py's builtin stack
    ("tests/thirdparty/test_haproxy.py", "thirdparty-stack"),
    ("tests/thirdparty/test_litellm.py", "thirdparty-stack"),
    ("tests/thirdparty/test_transformers_serve.py", "thirdparty-transformers"),
    ("tests/thirdparty/test_llama_cpp_python.py", "thirdparty-llama-cpp-python"),  # its servers, one per flag set
    ("tests/hops/runs/test_gateway_verdicts.py", "gateway-verdicts"),
    ("tests/hops/runs/test_gateway_processes.py", "gateway-processes"),
    ("tests/hops/runs/test_stream_fault_kinds.py", "stream-fault-kinds"),
    ("tests/hops/runs/test_streamhop.py", "streamhop"),
    ("tests/hops/runs/test_streamhop_h2.py", "streamhop-h2"),
    ("tests/e2e/test_path_runs.py", "path-runs"),
    ("tests/e2e/test_kill_matrix.py", "kill-matrix"),
    ("tests/stack/processes/test_malformed_http.py", "malformed-http"),
    ("tests/stack/processes/test_leases.py", "stack-leases"),  # tests/stack/conftest.py's session stack
)


def worker_group(nodeid: str) -> str | None:
    """The group whose worker runs this test, or None: any worker."""
    return next((group for prefix, group in ONE_WORKER if nodeid.startswith(prefix)), None)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent where xdist is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByTable(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's loadgroup with the groups from ONE_WORKER, every other test a unit of its own."""

        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid) or nodeid

    # in collection order (_QueueOrder below puts the vLLM tier first), not largest group first
    config.option.loadscopereorder = False
    return ByTable(config, log)


# Slow tests of half a minute or so that share no group: queued with the slow groups, ahead of the slow
# rest, so none of them is the suite's tail (a CI run: it began in the last half minute and its worker ran
# 20 s past the others). Not the light install's: its pip (35 s of CPU) beside the llama.cpp and gateway
# runs of the middle of the suite cost three of their verdicts in one CI run; at the end it costs none
LONG_FIRST = ("tests/survival/runs/test_survival_nginx.py",)


class _QueueOrder:
    """The order xdist hands the work out in (ByTable keeps collection order). The vLLM tier first: it
    takes one worker for ~5 min while the others run everything else (collected last, it ran alone at
    the end: 4 min of one idle worker). Then the other groups: each is one unit no worker can share,
    so none may be the suite's tail. Then the quick tier, so what runs beside vLLM's busy cores is
    mostly pure and in-process tests, not whole runs whose phase comparisons a neighbour starting or
    stopping can shift (a CI run: recovery at 1.77x). The slow rest last, its groups first (a group
    queued last would be the suite's tail). A group is queued where its first test is: k8s's quick
    tests put its whole runs beside vLLM, as before."""

    @pytest.hookimpl(trylast=True)  # after every folder's hook has marked its slow tests, and after deselection
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        def rank(item: pytest.Item) -> int:
            group, slow = worker_group(item.nodeid), item.get_closest_marker("slow") is not None
            if group == "vllm":
                return 0
            if group is not None:
                return 3 if slow else 1
            if slow and item.nodeid.startswith(LONG_FIRST):
                return 3
            return 4 if slow else 2

        items.sort(key=rank)  # stable: collection order within each rank


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_QueueOrder(), "streamchaos-queue-order")
    # The suite's runs obey a lever of their own, not the host's (chaos.fleet.lever): a lever engaged on a
    # developer's box or a CI host stops game-days, not loopback tests; the lever's tests name their own file.
    import os
    import tempfile

    own = Path(tempfile.gettempdir()) / f"streamchaos-tests-lever-{os.getpid()}"
    os.environ.setdefault("STREAMCHAOS_LEVER_FILE", str(own))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """torch in a test process runs on one thread. Its default, one per core, made each worker that
    runs torch in-process (exports, generate, the engine's own tests) spin OpenMP threads for the
    two cores the other workers and the stacks they start also need: test_export took 46 s beside
    the grouped modules instead of 12 (the quick tier used 288 s of CPU instead of 239). Processes
    the tests start (stacks, vLLM) set their own threads."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


# The failed tests' node ids, written by the controlling process (not by xdist's workers) to the file
# STREAMCHAOS_TEST_FAILED_FILE names: ./scripts/test runs them once more, alone on the box, and says
# which passed the second time (FLAKY). A test that fails twice fails the suite, and so do two FLAKY
# in one run or one FLAKY in two runs in a row (scripts/test).
FAILED_FILE_ENV = "STREAMCHAOS_TEST_FAILED_FILE"
_failed: list[str] = []
# Every setup, call and teardown of 50 ms or more, with when it started and on which worker, written
# by the controller to the file STREAMCHAOS_TEST_DURATIONS_FILE names (./scripts/test: test-artifacts/):
# the suite's time is its slowest worker's queue, which `--durations` (the slowest 25, no order, no
# worker) cannot show; this file is the whole timeline, to find what to shorten.
DURATIONS_FILE_ENV = "STREAMCHAOS_TEST_DURATIONS_FILE"
_timings: list[tuple[float, float, str, str, str]] = []  # start, stop (epoch s), when, worker, node id


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and report.nodeid not in _failed:
        _failed.append(report.nodeid)
    if report.stop - report.start >= 0.05:
        gateway = getattr(getattr(report, "node", None), "gateway", None)  # xdist's worker, on the controller
        _timings.append((report.start, report.stop, report.when, str(getattr(gateway, "id", "main")), report.nodeid))


def pytest_sessionfinish(session: pytest.Session) -> None:
    import os

    if hasattr(session.config, "workerinput"):  # the controller sees every worker's reports
        return
    target = os.environ.get(FAILED_FILE_ENV)
    if target:
        Path(target).write_text("".join(f"{nodeid}\n" for nodeid in _failed))
    durations = os.environ.get(DURATIONS_FILE_ENV)
    if durations and _timings:
        t0 = min(start for start, *_ in _timings)
        rows = [f"{start - t0:.2f}\t{stop - start:.2f}\t{when}\t{worker}\t{nodeid}\n"
                for start, stop, when, worker, nodeid in sorted(_timings)]
        Path(durations).parent.mkdir(parents=True, exist_ok=True)
        Path(durations).write_text("start_s\tseconds\twhen\tworker\tnode_id\n" + "".join(rows))
