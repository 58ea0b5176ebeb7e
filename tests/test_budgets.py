"""`streamchaos budgets` on synthetic healthy runs: the proposed budgets are passed by fresh runs
of the same process at least as often as promised, are written in place, and bad input is refused."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import sla
from chaos.cli import main
from chaos.execution.budgets import Proposal, load_baselines, propose, write_budgets
from chaos.experiment import parse_experiment
from chaos.model.errors import UsageError
from chaos.model.observations import NS, Observations, PhaseWindow, StreamRecord

pytestmark = pytest.mark.timeout(120)

EXPERIMENT = """\
# budgets for a synthetic stack
name: synth
seed: 1
phases:
  - {name: steady, duration: 20s}
sla:
  - {kind: ttft, quantile: p90, budget: 1s}   # keep this comment
  - kind: goodput
    ttft: 150ms
    min_share: 50%
  - {kind: throughput, min_requests_per_s: 1/s}
  - {kind: errors}
"""
T0 = 1000 * NS


def synthetic_run(seed: int, n: int = 400) -> Observations:
    """n requests 50 ms apart; TTFT lognormal around 80 ms (a few over 150 ms), 10 tokens 10 ms apart."""
    rng = np.random.default_rng(seed)
    streams = []
    for i in range(n):
        sent = T0 + i * 50_000_000
        first = sent + int(rng.lognormal(math.log(0.08), 0.3) * NS)
        stamps = [first + k * 10_000_000 for k in range(10)]
        streams.append(StreamRecord(id=f"r{i}", phase="steady", t_sent=sent, t_first_content=first, t_content=stamps,
                                    t_end=stamps[-1] + 1_000_000, status=200, finish_reason="length", done_seen=True))
    end = T0 + n * 50_000_000 + NS
    return Observations(experiment="synth", t0=T0, streams=streams, phases=[PhaseWindow("steady", T0, end)])


def write_run(root: Path, name: str, obs: Observations, experiment: str = EXPERIMENT) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "experiment.yaml").write_text(experiment, encoding="utf-8")
    obs.dump(run_dir / "journal.jsonl")
    return run_dir


def test_fresh_runs_of_the_same_process_pass_the_proposed_budgets(tmp_path: Path) -> None:
    runs = load_baselines([write_run(tmp_path, f"run{s}", synthetic_run(s)) for s in range(3)])
    proposals = {p.name: p for p in propose(runs, false_fail=0.01)}
    ttft, goodput, throughput = proposals["ttft"], proposals["goodput"], proposals["throughput"]
    assert ttft.key == "budget" and ttft.proposed is not None and ttft.samples_needed is not None
    assert goodput.key == "min_share" and goodput.proposed is not None
    assert throughput.key == "min_requests_per_s" and throughput.proposed is not None
    assert proposals["errors"].proposed is None and "policy" in proposals["errors"].notes[0]
    # not absurdly loose: the true p90 is 0.08 * exp(1.2816 * 0.3) = 117 ms
    assert 0.117 < ttft.proposed < 0.2, ttft
    # fresh healthy runs: each SLA is passed at least (1 - 1%) of the time, up to sampling slack
    entries = {e.name: e for e in runs[0].experiment.sla}
    fresh = [synthetic_run(100 + s) for s in range(100)]
    for name, p in (("ttft", ttft), ("goodput", goodput), ("throughput", throughput)):
        assert p.key is not None and p.proposed is not None
        params = dict(entries[name].params, **{p.key: p.proposed})
        passed = sum(sla.judge(obs, entries[name].kind, params, "steady", parsed=True).status == "pass"
                     for obs in fresh)
        print(f"{name}: proposed {p.text}, fresh runs passing {passed}/100")
        assert passed >= 97, (name, p.text, passed)


def test_budgets_are_written_in_place_and_the_file_still_validates(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    dirs = [write_run(tmp_path, f"run{s}", synthetic_run(s)) for s in range(2)]
    target = tmp_path / "synth.yaml"
    target.write_text(EXPERIMENT, encoding="utf-8")
    assert main(["budgets", *map(str, dirs), "--false-fail", "1%", "--write", str(target)]) == 0
    out = capsys.readouterr().out
    assert "PROPOSED" in out and "wrote 3 value(s)" in out
    text = target.read_text(encoding="utf-8")
    assert text.startswith("# budgets for a synthetic stack\n") and "# keep this comment" in text
    edited = parse_experiment(text, str(target))
    assert edited.sla[0].params["budget"] != 1.0 and edited.sla[1].params["min_share"] != 0.5
    # only the three values changed: same lines otherwise
    before, after = EXPERIMENT.splitlines(), text.splitlines()
    assert len(before) == len(after) and sum(a != b for a, b in zip(before, after, strict=True)) == 3


def test_a_proposal_that_would_not_validate_leaves_the_file_alone(tmp_path: Path) -> None:
    runs = load_baselines([write_run(tmp_path, "run0", synthetic_run(0))])
    target = tmp_path / "synth.yaml"
    target.write_text(EXPERIMENT, encoding="utf-8")
    broken = Proposal(0, "ttft", "ttft", "budget", "s", 1.0, None)
    broken.proposed = -1.0  # a negative duration: the loader refuses it
    with pytest.raises(UsageError, match="would not validate"):
        write_budgets(target, [broken], runs)
    assert target.read_text(encoding="utf-8") == EXPERIMENT


def test_one_run_says_run_to_run_variation_is_unmeasured(tmp_path: Path) -> None:
    runs = load_baselines([write_run(tmp_path, "run0", synthetic_run(0))])
    ttft = next(p for p in propose(runs) if p.name == "ttft")
    assert any("one run" in note for note in ttft.notes)


def test_short_runs_are_told_how_many_samples_they_need(tmp_path: Path) -> None:
    runs = load_baselines([write_run(tmp_path, f"run{s}", synthetic_run(s, n=20)) for s in range(2)])
    ttft = next(p for p in propose(runs) if p.name == "ttft")
    assert ttft.proposed is None
    assert ttft.samples_needed is not None and ttft.samples_needed >= 36  # a p90 needs 36 at 95%
    assert "lengthen the phase" in " ".join(ttft.notes)


def test_runs_of_different_experiments_and_non_run_dirs_are_refused(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path, "a", synthetic_run(0))
    b = write_run(tmp_path, "b", synthetic_run(1), EXPERIMENT.replace("name: synth", "name: other"))
    with pytest.raises(UsageError, match="give runs of one experiment"):
        load_baselines([a, b])
    assert main(["budgets", str(tmp_path / "nowhere")]) == 2
    assert "not a finished run directory" in capsys.readouterr().err
    assert main(["budgets", str(a), "--false-fail", "lots"]) == 2
    assert "--false-fail" in capsys.readouterr().err
    assert main(["budgets", str(a), "--false-fail", "60%"]) == 2
    other = tmp_path / "other.yaml"
    other.write_text(EXPERIMENT.replace("  - {kind: errors}\n", ""), encoding="utf-8")
    assert main(["budgets", str(a), "--write", str(other)]) == 2
    assert "not the runs'" in capsys.readouterr().err


def test_an_entry_over_several_phases_takes_the_loosest_and_says_each(tmp_path: Path) -> None:
    two_phases = EXPERIMENT.replace("  - {name: steady, duration: 20s}\n",
                                    "  - {name: steady, duration: 20s}\n  - {name: later, duration: 20s}\n").replace(
        "  - {kind: ttft, quantile: p90, budget: 1s}",
        "  - {kind: ttft, phases: [steady, later], quantile: p90, budget: 1s}")

    def run_with_later(seed: int) -> Observations:
        obs = synthetic_run(seed)
        slow = synthetic_run(seed + 50)
        end = obs.phases[0].t_end or 0
        for st in slow.streams:  # the later phase: every TTFT 50 ms slower
            shift = end - T0
            st.phase, st.id = "later", "l" + st.id
            st.t_sent = (st.t_sent or 0) + shift
            st.t_first_content = (st.t_first_content or 0) + shift + 50_000_000
            st.t_content = [t + shift + 50_000_000 for t in st.t_content]
            st.t_end = (st.t_end or 0) + shift + 50_000_000
        obs.streams += slow.streams
        obs.phases.append(PhaseWindow("later", end, end + (end - T0)))
        return obs

    runs = load_baselines([write_run(tmp_path, f"run{s}", run_with_later(s), two_phases) for s in range(2)])
    ttft = next(p for p in propose(runs) if p.name == "ttft")
    steady = next(n for n in ttft.notes if n.startswith("phase steady:"))
    later = next(n for n in ttft.notes if n.startswith("phase later:"))
    assert ttft.text == later.split(": ")[1].split(" ")[0]  # the budget must hold in the slower phase
    assert steady != later


def test_the_table_says_in_plain_words_what_needed_and_n_eff_mean(tmp_path: Path) -> None:
    from chaos.execution.budgets import render_proposals

    runs = load_baselines([write_run(tmp_path, f"run{s}", synthetic_run(s, n=120)) for s in range(2)])
    text = render_proposals(propose(runs, false_fail=0.01), runs, 0.01)
    assert "NEEDED: how many samples, counted like SAMPLES/RUN (not like n_eff), a run needs" in text
    assert "(n_eff N): successive samples are alike, so they carry as much information as N independent ones" in text
    assert "ttft, how it was found: " in text


def test_headroom_widens_latency_budgets_and_lowers_rate_floors_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Room for a box unlike the baselines' (a shared CI machine), applied last and stated."""
    dirs = [write_run(tmp_path, f"run{s}", synthetic_run(s)) for s in range(3)]
    runs = load_baselines(dirs)
    plain = {p.name: p for p in propose(runs, false_fail=0.01)}
    roomy = {p.name: p for p in propose(runs, false_fail=0.01, headroom=0.25)}
    assert roomy["ttft"].proposed == pytest.approx(plain["ttft"].proposed * 1.25)
    assert roomy["throughput"].proposed == pytest.approx(plain["throughput"].proposed * 0.75)
    assert roomy["goodput"].proposed == plain["goodput"].proposed  # a share floor keeps its binomial allowance
    assert any("25% headroom" in n for n in roomy["ttft"].notes)
    assert main(["budgets", *map(str, dirs), "--headroom", "25%"]) == 0
    assert "plus 25% headroom for a box unlike theirs" in capsys.readouterr().out
    assert main(["budgets", *map(str, dirs), "--headroom", "100%"]) == 2
    assert "--headroom must lie between 0 and 100%" in capsys.readouterr().err
