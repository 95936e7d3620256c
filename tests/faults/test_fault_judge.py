"""The pairwise judge's faults: the authors' reply parser taking a verdict in the wrong case."""

from __future__ import annotations

from dsl_llada.eval.judge import Pair, Sample, judgment_record, parse_reply


def test_authors_parser_gives_nothing_for_a_lowercase_verdict():
    """docs/provenance.md §5.7: the authors' parser returns the decoded object only when its "overall" is exactly
    "A", "B" or "tie"; {"overall": "a"} gives nothing, so the judgment is unparsed (dropped from the win rate)."""
    assert parse_reply('{"overall": "a"}', mode="authors") is None
    assert parse_reply('verdict: {"overall": "A"}', mode="authors") == {"overall": "A"}  # exactly, as decoded
    s = Sample("1", "x", "r")
    rec = judgment_record(Pair("1", False, s, s), '{"overall": "a"}', mode="authors")
    assert rec["parsed"] is False and "winner" not in rec
    assert judgment_record(Pair("1", False, s, s), '{"overall": "A"}', mode="authors")["winner"] == "A"
