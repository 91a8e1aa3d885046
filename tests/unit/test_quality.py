"""The quality gate (budgetgen.quality): what observe() sees in a response, each gate's fate of it, the
journal scan counting kept tokens (flags read without a parse, older records observed from their text),
and the budget rule's length model learning the keep rate by length."""

import json

from budgetgen import journal
from budgetgen.budget import DispatchPolicy
from budgetgen.lengths import LengthModel
from budgetgen.quality import Gate, dropped_text, observe
from budgetgen_testkit.records import stamped


def test_observe_names_each_fact_of_a_response():
    assert observe("an answer", None, "stop") == []
    assert observe("", "", "stop") == ["empty"]
    assert observe("cut short", None, "length") == ["truncated"]
    assert observe("", "thinking all the way", "stop") == ["unclosed_reasoning"]  # a parser left no answer
    assert observe("<think>never closed", None, "stop") == ["unclosed_reasoning"]
    assert observe("<think>closed</think>answer", None, "stop") == []  # reasoning in the text, closed
    assert observe("answer <think>", "separate reasoning", "stop") == ["unclosed_reasoning"]  # a leftover tag
    assert observe("", "cut inside reasoning", "length") == ["truncated", "unclosed_reasoning"]
    assert observe("x", None, "stop", forced_end=True) == ["reasoning_forced_end"]
    assert observe("[R]open", None, "stop", tags=("[R]", "[/R]")) == ["unclosed_reasoning"]


def test_a_gate_keeps_flags_or_drops_by_the_first_reason():
    gate = Gate(truncated="drop", unclosed_reasoning="flag", min_supervised_tokens=5)
    assert gate.fate([], 10).kept and gate.fate([], 10).flagged == ()
    assert gate.fate(["truncated", "unclosed_reasoning"], 10).reason == "truncated"
    assert gate.fate(["unclosed_reasoning"], 10).flagged == ("unclosed_reasoning",)
    assert gate.fate(["unclosed_reasoning"], 3).reason == "min_supervised_tokens"
    assert gate.fate(["empty"], 0).reason == "empty"  # empty: drop by default
    assert Gate().fate(["truncated"], 10).kept and not Gate().passes_all and Gate(empty="keep").passes_all
    assert dropped_text({"unclosed_reasoning": 2, "truncated": 3}) == "truncated=3;unclosed_reasoning=2"
    assert dropped_text({}) == "0"


def record(rid, tokens, finish="stop", content="ok", flags=True):
    rec = stamped({"id": rid, "messages": [{"role": "user", "content": "q"},
                                           {"role": "assistant", "content": content}],
                   "finish_reason": finish, "usage": {"completion_tokens": tokens}})
    if flags:
        rec["flags"] = observe(content, None, finish)
    return rec


def test_scan_counts_kept_tokens_from_flags_and_observes_records_without_them(tmp_path):
    path = tmp_path / "journal.jsonl"
    recs = [record("a", 10), record("b", 40, "length"), record("c", 7, content=""),
            record("d", 40, "length", flags=False), record("e", 5, flags=False)]
    with path.open("w") as f:
        for r in recs:
            f.write(journal.encode_record(r))
    assert json.loads(path.read_text().splitlines()[1])["flags"] == ["truncated"]
    gate = Gate(truncated="drop")
    st = journal.scan(path, gate_of=lambda sha, cell: gate)
    assert (st.tokens, st.generated_tokens, st.records) == (15, 102, 5)
    assert st.dropped == {"truncated": 2, "empty": 1} and st.kept == [True, False, False, False, True]
    plain = journal.scan(path)  # no gate: every record kept
    assert plain.tokens == plain.generated_tokens == 102 and not plain.dropped


def test_the_length_model_learns_that_long_requests_are_dropped():
    # half the responses run into max_tokens (100) and are dropped; the rest end near 20
    lengths = [20, 100] * 50
    kept = [True, False] * 50
    model = LengthModel(100, lengths, kept)
    mean_far, _ = model.final_moments(50)  # streamed past every kept length: it will be cut, count 0
    assert mean_far == 0.0
    mean_fresh, _ = model.final_moments(0)
    assert abs(mean_fresh - 10.0) < 1e-9  # E[K] = 0.5 * 20
    without = LengthModel(100, lengths)
    assert without.final_moments(0)[0] == 60.0 and without.final_moments(50)[0] == 100.0
    # the rule: 100 requests in flight at 50 tokens count nothing toward a budget of kept tokens
    assert DispatchPolicy(10_000, model).may_dispatch(9_000, [50.0] * 100)
    assert not DispatchPolicy(10_000, without).may_dispatch(9_000, [50.0] * 100)
    # the bound the rule's shortcut uses still holds once a drop widens the range to [0, largest]
    for k in (0, 10, 50, 99):
        mean, var = model.final_moments(k)
        hi_mean, hi_var = model.moment_bounds(k)
        assert mean <= hi_mean and var <= hi_var
