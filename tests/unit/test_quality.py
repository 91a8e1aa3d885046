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


SPECIALS = ("<think>", "</think>", "<|endoftext|>", "<|im_end|>", "<|im_start|>")


def test_degenerate_output_is_named_where_it_lives():
    prose = ("Paris is the capital of France. It lies on the Seine, in the north of the country, and has "
             "been its largest city since the Middle Ages. ") * 1
    assert observe(prose, None, "stop", specials=SPECIALS) == []
    loop = prose + "the the the " * 300
    assert observe(loop, None, "length") == ["repetition", "truncated"]
    sentence_loop = "I will check the result again to be sure it is right. " * 60
    assert observe(sentence_loop, None, "stop") == ["repetition"]
    # a long answer with one block repeated once: its tail is not a loop
    words = [f"w{i}" for i in range(600)]
    block = " ".join(words[:80])
    assert observe(" ".join(words[80:300]) + " " + block + " " + block + " " + " ".join(words[300:]),
                   None, "stop") == []
    assert observe("short answer " * 10, None, "stop") == []  # too short to be called a loop
    assert observe("caf\ufffd\ufffd cr\ufffdme", None, "stop") == ["replacement_chars"]
    assert observe("a cut multi-byte char\ufffd", None, "length") == ["truncated"]  # the cut's own
    assert observe("x\ufffd y\ufffd", None, "length") == ["replacement_chars", "truncated"]
    assert observe("4.<|im_end|>\n<|im_start|>user\nthanks", None, "stop", specials=SPECIALS) == ["template_leak"]
    assert observe("<think>a</think>4", None, "stop", specials=SPECIALS) == []  # the reasoning tags are no leak
    assert observe("4.<|im_end|>", None, "stop") == []  # no specials given: not looked for
    # the reasoning counts as text too: a loop in reasoning_content
    assert observe("", "wait, " * 400, "length") == ["repetition", "truncated", "unclosed_reasoning"]


def test_a_gate_keeps_flags_or_drops_by_the_first_reason():
    gate = Gate(truncated="drop", unclosed_reasoning="flag", min_supervised_tokens=5)
    assert gate.fate([], 10).kept and gate.fate([], 10).flagged == ()
    assert gate.fate(["truncated", "unclosed_reasoning"], 10).reason == "truncated"
    assert gate.fate(["unclosed_reasoning"], 10).flagged == ("unclosed_reasoning",)
    assert gate.fate(["unclosed_reasoning"], 3).reason == "min_supervised_tokens"
    assert gate.fate(["empty"], 0).reason == "empty"  # empty: drop by default
    assert Gate().fate(["truncated"], 10).kept and not Gate().passes_all
    assert Gate(empty="keep", repetition="keep", replacement_chars="keep", template_leak="keep").passes_all
    assert Gate().fate(["repetition", "truncated"], 10).flagged == ("repetition",)  # degenerate: flag by default
    assert Gate(repetition="drop").fate(["repetition", "truncated"], 10).reason == "repetition"  # the server's
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


def test_a_character_cut_by_max_tokens_inside_the_reasoning_is_not_mojibake():
    # a response cut during its reasoning ends where the reasoning does: its last U+FFFD is the cut's
    assert observe("", "thinking about caf\ufffd", "length") == ["truncated", "unclosed_reasoning"]
    assert observe("", "x\ufffd y\ufffd", "length") == ["replacement_chars", "truncated", "unclosed_reasoning"]


def test_keep_share_leaves_server_faults_to_the_breaker_until_the_run_ends():
    from budgetgen.quality import keep_problem

    assert keep_problem(60, {"empty": 58}, 0.1, final=False) is None  # the breaker's to judge per endpoint
    reason, line = keep_problem(60, {"empty": 58}, 0.1, final=True)
    assert reason == "empty" and line.startswith("kept 2 of 60 responses (3%, quality.min_keep_share 0.1): 58 of 60")
    reason, line = keep_problem(50, {"truncated": 50}, 0.1, final=False, max_tokens=200)
    assert reason == "truncated" and "max_tokens 200 cut 50 of 50 responses" in line
    assert keep_problem(49, {"truncated": 49}, 0.1, final=False) is None  # too few to judge yet
    assert keep_problem(10, {"truncated": 1}, 0.1, final=True) is None
