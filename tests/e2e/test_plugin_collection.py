"""The pytest plugin collects YAML experiments as test items and reports each verdict."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

EXPERIMENT = """
name: collected
target: {kind: builtin, model: tiny}
load: {concurrency: 2, max_tokens: 8}
phases:
  - {name: steady, duration: 1500ms}
sla:
  - {kind: early_close, budget: 0%}
  - {kind: errors, budget: 0%}
  - {kind: errors, name: impossible, budget: 0%, expect: fail}
safety: {cleanup_window: 500ms}
"""


@pytest.mark.timeout(180)
def test_yaml_experiments_are_collected_and_judged(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nstreamchaos_experiments = exps\n")
    exps = pytester.mkdir("exps")
    (exps / "good.yaml").write_text(
        EXPERIMENT.replace("  - {kind: errors, name: impossible, budget: 0%, expect: fail}\n", ""))
    (exps / "bad.yaml").write_text(EXPERIMENT)  # expects errors to fail on a healthy stack: it won't
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*impossible*pass (expected fail)*"])
