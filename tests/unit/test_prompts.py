"""prompts.jsonl parsing: formats, trimming, ids, duplicates, errors, skip mode, dispatch order."""

import json

import pytest

from budgetgen.errors import UserError
from budgetgen.prompts import (
    Prompt,
    PromptSet,
    dispatch_order,
    load_prompts,
    normalise_record,
    stable_id,
)


def write_lines(tmp_path, lines, name="prompts.jsonl"):
    """Write records (dicts are JSON-encoded, str/bytes written as is), one per line."""
    path = tmp_path / name
    out = []
    for line in lines:
        if isinstance(line, bytes):
            out.append(line)
        elif isinstance(line, str):
            out.append(line.encode("utf-8"))
        else:
            out.append(json.dumps(line, ensure_ascii=False).encode("utf-8"))
    path.write_bytes(b"\n".join(out) + b"\n")
    return str(path)


def load_one(tmp_path, record):
    ps = load_prompts(write_lines(tmp_path, [record]))
    assert len(ps.prompts) == 1
    return ps.prompts[0]


def user(text):
    return {"role": "user", "content": text}


def system(text):
    return {"role": "system", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def error_for(tmp_path, lines):
    path = write_lines(tmp_path, lines)
    with pytest.raises(UserError) as excinfo:
        load_prompts(path)
    return path, str(excinfo.value)


# --- the four formats ---------------------------------------------------------------------------


def test_openai_messages_normalised(tmp_path):
    p = load_one(
        tmp_path,
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    )
    assert isinstance(p, Prompt)
    assert list(p.messages) == [system("Be brief."), user("Hi")]
    assert p.line == 1


def test_openai_extra_message_keys_dropped(tmp_path):
    p = load_one(tmp_path, {"messages": [{"role": "user", "content": "Hi", "name": "bob", "weight": 1}]})
    assert list(p.messages) == [user("Hi")]


def test_openai_developer_maps_to_system(tmp_path):
    p = load_one(tmp_path, {"messages": [{"role": "developer", "content": "Rules"}, user("Q")]})
    assert list(p.messages) == [system("Rules"), user("Q")]


def test_openai_list_content_parts_joined(tmp_path):
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    p = load_one(tmp_path, {"messages": [{"role": "user", "content": parts}]})
    assert list(p.messages) == [user("Hello, world")]


def test_openai_assistant_null_content_is_empty_string(tmp_path):
    p = load_one(tmp_path, {"messages": [user("a"), {"role": "assistant", "content": None}, user("b")]})
    assert list(p.messages) == [user("a"), assistant(""), user("b")]


def test_sharegpt_roles_mapped(tmp_path):
    conv = [
        {"from": "system", "value": "S"},
        {"from": "human", "value": "h1"},
        {"from": "gpt", "value": "g"},
        {"from": "user", "value": "u"},
        {"from": "chatgpt", "value": "c"},
        {"from": "bard", "value": "b"},
        {"from": "model", "value": "m"},
        {"from": "assistant", "value": "a"},
        {"from": "human", "value": "last"},
    ]
    p = load_one(tmp_path, {"conversations": conv})
    assert list(p.messages) == [
        system("S"),
        user("h1"),
        assistant("g"),
        user("u"),
        assistant("c"),
        assistant("b"),
        assistant("m"),
        assistant("a"),
        user("last"),
    ]


def test_sharegpt_role_content_items_accepted(tmp_path):
    p = load_one(tmp_path, {"conversations": [{"role": "user", "content": "Q"}]})
    assert list(p.messages) == [user("Q")]


def test_prompt_format_without_system_has_exactly_one_user_message(tmp_path):
    p = load_one(tmp_path, {"prompt": "Tell me a joke"})
    assert list(p.messages) == [user("Tell me a joke")]


def test_prompt_format_with_system(tmp_path):
    p = load_one(tmp_path, {"prompt": "Q", "system": "You are terse."})
    assert list(p.messages) == [system("You are terse."), user("Q")]


def test_instruction_format_with_and_without_input(tmp_path):
    path = write_lines(
        tmp_path,
        [
            {"instruction": "Translate", "input": "bonjour"},
            {"instruction": "Count to 3"},
            {"instruction": "Say hi", "input": ""},
            {"instruction": "I", "system": "S"},
        ],
    )
    ps = load_prompts(path)
    assert [list(p.messages) for p in ps.prompts] == [
        [user("Translate\n\nbonjour")],
        [user("Count to 3")],
        [user("Say hi")],
        [system("S"), user("I")],
    ]


def test_first_matching_field_wins(tmp_path):
    p = load_one(tmp_path, {"prompt": "ignored", "messages": [user("from messages")]})
    assert list(p.messages) == [user("from messages")]


def test_normalise_record_direct():
    assert normalise_record({"prompt": "x"}, "f.jsonl:3") == [user("x")]
    with pytest.raises(UserError, match=r"^f\.jsonl:3: no user turn"):
        normalise_record({"messages": [system("s")]}, "f.jsonl:3")


# --- multi-turn trimming ------------------------------------------------------------------------


def test_trailing_assistant_turns_dropped_earlier_kept(tmp_path):
    msgs = [system("s"), user("u1"), assistant("a1"), user("u2"), assistant("a2"), assistant("a3")]
    p = load_one(tmp_path, {"messages": msgs})
    assert list(p.messages) == [system("s"), user("u1"), assistant("a1"), user("u2")]


def test_sharegpt_trailing_gpt_turn_dropped(tmp_path):
    conv = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "answer"}]
    p = load_one(tmp_path, {"conversations": conv})
    assert list(p.messages) == [user("q")]


# --- ids ----------------------------------------------------------------------------------------


def test_stable_id_same_across_formats_and_key_order(tmp_path):
    path = write_lines(
        tmp_path,
        [
            {"prompt": "What is 2+2?"},
            {"messages": [{"role": "user", "content": "What is 2+2?"}]},
            '{"messages": [{"content": "What is 2+2?", "role": "user"}]}',
            {"conversations": [{"from": "human", "value": "What is 2+2?"}]},
            {"instruction": "What is 2+2?"},
        ],
    )
    ps = load_prompts(path)
    # all five are the same conversation -> one prompt, four duplicates
    assert len(ps.prompts) == 1
    assert ps.duplicates == 4
    assert ps.prompts[0].id == stable_id([user("What is 2+2?")])


def test_stable_id_format_and_differs_for_different_content():
    a = stable_id([user("a")])
    assert a.startswith("p") and len(a) == 21
    assert a == stable_id([{"content": "a", "role": "user"}])
    assert a != stable_id([user("b")])
    assert a != stable_id([system("a")])
    assert a != stable_id([system("s"), user("a")])


def test_explicit_ids_int_and_str_used_as_str(tmp_path):
    ps = load_prompts(write_lines(tmp_path, [{"id": 7, "prompt": "a"}, {"id": "x-1", "prompt": "b"}]))
    assert [p.id for p in ps.prompts] == ["7", "x-1"]


def test_duplicate_same_content_counted_and_dropped(tmp_path):
    ps = load_prompts(
        write_lines(
            tmp_path,
            [{"id": 1, "prompt": "a"}, {"id": 2, "prompt": "b"}, {"id": 1, "prompt": "a"}, {"prompt": "c"}],
        )
    )
    assert [p.id for p in ps.prompts] == ["1", "2", stable_id([user("c")])]
    assert [p.line for p in ps.prompts] == [1, 2, 4]
    assert ps.duplicates == 1
    assert ps.lines == 4
    assert ps.skipped == []


def test_duplicate_id_different_content_is_error_naming_both_lines(tmp_path):
    path, msg = error_for(tmp_path, [{"id": "k", "prompt": "a"}, {"prompt": "z"}, {"id": "k", "prompt": "b"}])
    assert msg.startswith(f"{path}:3: ")
    assert "duplicate id 'k'" in msg
    assert "first seen on line 1" in msg


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, reason",
    [
        ('{"prompt": "a",, }', "malformed JSON"),
        ('{"prompt": "unterminated', "malformed JSON"),
        ("[1, 2]", "line is not a JSON object (got list)"),
        ('"just a string"', "line is not a JSON object (got string)"),
        ({"text": "hello"}, "no recognised prompt field"),
        ({"prompt": "   "}, "empty content"),
        ({"messages": [user("ok"), assistant("x"), user("")]}, "empty content"),
        ({"messages": [system("only system")]}, "no user turn"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "unknown role 'robot' in messages[0]"),
        ({"conversations": [{"from": "alien", "value": "x"}]}, "unknown role 'alien' in conversations[0]"),
        (b'{"prompt": "caf\xe9"}', "not valid UTF-8"),
        ({"prompt": 5}, "field 'prompt' must be a string"),
        ({"messages": "hi"}, "field 'messages' must be a list"),
        ({"conversations": {"from": "human"}}, "field 'conversations' must be a list"),
        ({"instruction": ["x"]}, "field 'instruction' must be a string"),
        ({"instruction": "x", "input": 3}, "field 'input' must be a string"),
        ({"prompt": "x", "system": 1}, "field 'system' must be a string"),
        ({"id": "", "prompt": "x"}, "field 'id' is an empty string"),
        ({"id": True, "prompt": "x"}, "field 'id' must be a string or an integer"),
        ({"id": 1.5, "prompt": "x"}, "field 'id' must be a string or an integer"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "unsupported content part type 'image_url'",
        ),
    ],
)
def test_bad_line_raises_user_error_naming_file_and_line(tmp_path, bad, reason):
    path, msg = error_for(tmp_path, [{"prompt": "good"}, "", bad])
    assert msg.startswith(f"{path}:3: "), msg
    assert reason in msg
    assert "\n" not in msg


# A lone surrogate escape is valid JSON but not encodable text: every request and the id hash of a
# line without id would raise UnicodeEncodeError far from the line. (A raw line: json.dumps of such
# a string cannot be written as UTF-8.)
SURROGATE_LINES = [
    (r'{"prompt": "bad \ud800 text"}', "invalid Unicode: lone surrogate \\ud800 in field 'prompt'"),
    (r'{"id": "x\uDC00", "prompt": "fine"}', "invalid Unicode: lone surrogate \\udc00 in field 'id'"),
    (r'{"prompt": "fine", "system": "sys \ud83d"}', "invalid Unicode: lone surrogate \\ud83d in field 'system'"),
    (r'{"conversations": [{"from": "human", "value": "emoji \ud83d split"}]}',
     "invalid Unicode: lone surrogate \\ud83d in conversations[0].value"),
    (r'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\ude00"}]}]}',
     "invalid Unicode: lone surrogate \\ude00 in messages[0].content[0].text"),
    (r'{"prompt": "fine", "meta": {"tags": ["ok", "\udbff"]}}',
     "invalid Unicode: lone surrogate \\udbff in meta.tags[1]"),
    (r'{"prompt": "fine", "k\ud800": 1}', "invalid Unicode: lone surrogate \\ud800 in a key of the record"),
]


@pytest.mark.parametrize("line, reason", SURROGATE_LINES,
                         ids=["prompt-no-id", "id", "system", "sharegpt-value", "content-part", "unread-field", "key"])
def test_lone_surrogate_is_a_bad_line_under_both_policies(tmp_path, line, reason):
    path, msg = error_for(tmp_path, [{"id": "g1", "prompt": "good"}, line, {"id": "g2", "prompt": "also good"}])
    assert msg == f"{path}:2: {reason}"
    ps = load_prompts(path, on_bad_line="skip")
    assert ps.skipped == [(2, reason)]
    assert [p.id for p in ps.prompts] == ["g1", "g2"]
    # what was kept encodes: the request body and the journal line
    json.dumps([p.messages for p in ps.prompts], ensure_ascii=False).encode("utf-8")


def test_surrogate_pairs_and_escaped_backslashes_are_not_lone(tmp_path):
    path = write_lines(tmp_path, [r'{"prompt": "emoji \ud83d\ude00 whole"}', r'{"prompt": "text \\ud800 literal"}'])
    ps = load_prompts(path)
    assert [p.messages[0]["content"] for p in ps.prompts] == ["emoji \U0001f600 whole", "text \\ud800 literal"]
    assert all(p.id.startswith("p") for p in ps.prompts)


def test_lone_surrogate_in_a_record_from_a_source_row():
    # budgetgen.sources validates rows through normalise_record (no JSON text to look at)
    with pytest.raises(UserError) as excinfo:
        normalise_record({"prompt": "bad \ud800"}, "src.parquet: row 4")
    assert str(excinfo.value) == "src.parquet: row 4: invalid Unicode: lone surrogate \\ud800 in field 'prompt'"


def test_malformed_json_reason_includes_column(tmp_path):
    path, msg = error_for(tmp_path, ['{"a": 1 "b": 2}'])
    assert msg == f"{path}:1: malformed JSON (Expecting ',' delimiter at column 9)"


def test_error_message_truncates_huge_values(tmp_path):
    huge_role = "r" * 100_000
    path, msg = error_for(tmp_path, [{"messages": [{"role": huge_role, "content": "x"}]}])
    assert msg.startswith(f"{path}:1: unknown role ")
    assert len(msg) < len(path) + 200


def test_huge_malformed_line_error_is_short(tmp_path):
    path, msg = error_for(tmp_path, ['{"prompt": "' + "x" * 10_000_000])
    assert msg.startswith(f"{path}:1: malformed JSON")
    assert len(msg) < len(path) + 200


def test_first_bad_line_raises_by_default(tmp_path):
    path, msg = error_for(tmp_path, [{"prompt": "ok"}, "nope", {"text": "also bad"}])
    assert msg.startswith(f"{path}:2: malformed JSON")


def test_invalid_on_bad_line_value(tmp_path):
    path = write_lines(tmp_path, [{"prompt": "x"}])
    with pytest.raises(ValueError):
        load_prompts(path, on_bad_line="warn")


# --- files --------------------------------------------------------------------------------------


def test_ten_megabyte_line_parses(tmp_path):
    text = "x" * (10 * 1024 * 1024)
    p = load_one(tmp_path, {"prompt": text})
    assert p.messages[0]["content"] == text


def test_empty_file_no_prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"")
    with pytest.raises(UserError, match="no prompts found") as excinfo:
        load_prompts(str(path))
    assert str(excinfo.value).startswith(f"{path}: ")


def test_blank_only_file_no_prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"\n   \n\t\r\n\n")
    with pytest.raises(UserError, match="no prompts found"):
        load_prompts(str(path))


def test_all_lines_skipped_no_prompts(tmp_path):
    path = write_lines(tmp_path, ["bad", "[1]"])
    with pytest.raises(UserError, match="no prompts found"):
        load_prompts(path, on_bad_line="skip")


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match="prompts file not found") as excinfo:
        load_prompts(path)
    assert str(excinfo.value) == f"{path}: prompts file not found"


def test_directory_is_user_error(tmp_path):
    with pytest.raises(UserError):
        load_prompts(str(tmp_path))


def test_blank_lines_ignored_and_line_numbers_kept(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'\n{"prompt": "a"}\n   \n{"prompt": "b"}\r\n')
    ps = load_prompts(str(path))
    assert isinstance(ps, PromptSet)
    assert ps.path == str(path)
    assert [p.line for p in ps.prompts] == [2, 4]
    assert ps.lines == 2


def test_no_trailing_newline(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "b"}')
    assert [p.messages[0]["content"] for p in load_prompts(str(path)).prompts] == ["a", "b"]


def test_skip_mode_collects_reasons_and_keeps_good_lines(tmp_path):
    path = write_lines(
        tmp_path,
        [
            {"prompt": "good1"},
            "not json",
            {"messages": [{"role": "robot", "content": "x"}]},
            "",
            {"id": "d", "prompt": "one"},
            b'{"prompt": "\xff"}',
            {"id": "d", "prompt": "two"},
            {"prompt": "good2"},
            {"prompt": "good1"},
        ],
    )
    ps = load_prompts(path, on_bad_line="skip")
    assert [p.messages[0]["content"] for p in ps.prompts] == ["good1", "one", "good2"]
    assert [line for line, _ in ps.skipped] == [2, 3, 6, 7]
    reasons = [reason for _, reason in ps.skipped]
    assert reasons[0].startswith("malformed JSON")
    assert reasons[1].startswith("unknown role 'robot'")
    assert reasons[2].startswith("not valid UTF-8")
    assert "duplicate id 'd'" in reasons[3] and "first seen on line 5" in reasons[3]
    assert ps.duplicates == 1
    assert ps.lines == 8


def test_load_15k_prompts(tmp_path):
    n = 15_000
    records = []
    for i in range(n):
        if i % 3 == 0:
            records.append({"prompt": f"question {i}"})
        elif i % 3 == 1:
            records.append({"id": i, "messages": [user(f"question {i}"), assistant("a")]})
        else:
            records.append({"conversations": [{"from": "human", "value": f"question {i}"}]})
    ps = load_prompts(write_lines(tmp_path, records))
    assert len(ps.prompts) == n
    assert ps.lines == n
    assert ps.duplicates == 0 and ps.skipped == []
    assert len({p.id for p in ps.prompts}) == n
    assert ps.prompts[1].id == "1"
    assert [p.messages[-1]["content"] for p in ps.prompts[:3]] == ["question 0", "question 1", "question 2"]
    assert ps.prompts[-1].line == n


# --- dispatch order -----------------------------------------------------------------------------


def test_dispatch_order_deterministic_permutation():
    ids = [f"id{i}" for i in range(200)]
    order = dispatch_order(ids, seed=1)
    assert order == dispatch_order(ids, seed=1)
    assert sorted(order) == sorted(ids)
    assert order != ids
    assert dispatch_order(list(reversed(ids)), seed=1) == order


def test_dispatch_order_depends_on_seed():
    ids = [f"id{i}" for i in range(200)]
    assert dispatch_order(ids, seed=1) != dispatch_order(ids, seed=2)


def test_dispatch_order_stable_when_ids_appended():
    ids = [f"id{i}" for i in range(200)]
    before = dispatch_order(ids, seed=7)
    after = dispatch_order(ids + [f"new{i}" for i in range(50)], seed=7)
    assert [i for i in after if i in set(ids)] == before
