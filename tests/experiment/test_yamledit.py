"""In-place YAML edits: only the changed values move; comments, order and styles stay."""

from __future__ import annotations

import pytest
import yaml

from chaos.experiment.yamledit import apply_edits
from chaos.model.errors import UsageError

pytestmark = pytest.mark.timeout(30)

TEXT = """\
# a comment at the top
name: demo   # trailing comment
sla:
  - {kind: ttft, quantile: p90, budget: 500ms}   # flow entry
  - kind: itl          # block entry
    budget: "100ms"    # quoted
    max_stall: 1s
  - kind: fluidity
    pace: 50ms
    # a comment between keys
    ttft: 1s  # comment on the last line
  - {kind: goodput, min_share: 90%}
"""


def test_scalars_are_replaced_in_place_and_everything_else_is_kept() -> None:
    out = apply_edits(TEXT, {("sla", 0, "budget"): "61.3ms", ("sla", 1, "budget"): "26.2ms",
                             ("sla", 3, "min_share"): "87.2%"})
    expected = (TEXT.replace("budget: 500ms}", "budget: 61.3ms}").replace('budget: "100ms"', 'budget: "26.2ms"')
                .replace("min_share: 90%}", "min_share: 87.2%}"))
    assert out == expected
    data = yaml.safe_load(out)
    assert data["sla"][0]["budget"] == "61.3ms" and data["sla"][1]["budget"] == "26.2ms"


def test_a_missing_key_is_added_in_the_mappings_style() -> None:
    out = apply_edits(TEXT, {("sla", 2, "min_on_time"): "99.3%", ("sla", 0, "confidence"): "0.9"})
    assert "  - {kind: ttft, quantile: p90, budget: 500ms, confidence: 0.9}   # flow entry\n" in out
    assert "    ttft: 1s  # comment on the last line\n    min_on_time: 99.3%\n" in out
    data = yaml.safe_load(out)
    assert data["sla"][2] == {"kind": "fluidity", "pace": "50ms", "ttft": "1s", "min_on_time": "99.3%"}
    # the rest of the file is byte for byte what it was
    assert out.replace(", confidence: 0.9", "").replace("    min_on_time: 99.3%\n", "") == TEXT


def test_a_block_mapping_at_the_end_of_a_file_without_newline() -> None:
    text = "sla:\n  - kind: fluidity\n    pace: 50ms"
    assert apply_edits(text, {("sla", 0, "min_on_time"): "95%"}) == text + "\n    min_on_time: 95%"


def test_bad_paths_are_clear_errors() -> None:
    with pytest.raises(UsageError, match=r"sla\[9\]"):
        apply_edits(TEXT, {("sla", 9, "budget"): "1s"})
    with pytest.raises(UsageError, match="not a single value"):
        apply_edits(TEXT, {("sla",): "1s"})
    with pytest.raises(UsageError, match="not readable YAML"):
        apply_edits("a: [", {("a",): "1"}, "x.yaml")
