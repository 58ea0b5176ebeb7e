"""Which faults a killed run left outstanding, read from its journal (pure)."""

from chaos.execution.rollback import outstanding


def fault(name: str, action: str, **extra: object) -> dict:
    return {"type": "fault", "fault": name, "kind": "gpu.throttle", "action": action, "t": 0, "phase": "p", **extra}


def test_plan_without_revert_is_outstanding_with_merged_undo() -> None:
    lines = [
        {"type": "run"},
        fault("a", "plan", undo={"device": 0}),
        fault("a", "inject", undo={"pids": [12]}),
        fault("b", "plan", undo={"x": 1}),
        fault("b", "inject"),
        fault("b", "revert"),
    ]
    assert outstanding(lines) == [{"fault": "a", "kind": "gpu.throttle", "phase": "p",
                                   "undo": {"device": 0, "pids": [12]}}]


def test_rolled_back_faults_are_done_and_replan_reopens() -> None:
    lines = [fault("a", "plan"), fault("a", "rollback"), fault("a", "plan", undo={"second": True})]
    assert [o["undo"] for o in outstanding(lines)] == [{"second": True}]
    assert outstanding(lines + [fault("a", "revert")]) == []


def test_a_crash_during_inject_is_still_outstanding() -> None:
    assert len(outstanding([fault("a", "plan"), fault("a", "error")])) == 1
