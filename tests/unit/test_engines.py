"""budgetgen.engines: one dialect per engine (request fields, where ids come back, reasoning fields,
per-chunk usage, error objects), the choice of engine from the config, and the mock server's own table
of released behaviours naming the same releases."""

import pytest

from budgetgen import engines
from budgetgen.engines import DIALECTS, dialect, engine_problem, resolve
from budgetgen_testkit.mock_server import RELEASED


@pytest.mark.parametrize("server, expected", [
    ({"return_token_ids": False}, ("openai", False)),
    ({"return_token_ids": True}, ("vllm", True)),
    ({"return_token_ids": "vllm"}, ("vllm", True)),
    ({"return_token_ids": "sglang"}, ("sglang", True)),
    ({"return_token_ids": False, "engine": "llamacpp"}, ("llamacpp", False)),
    ({"return_token_ids": True, "engine": "sglang"}, ("sglang", True)),
    ({"return_token_ids": False, "engine": "auto"}, ("openai", False)),
])
def test_the_engine_comes_from_server_engine_else_the_ids_setting(server, expected):
    assert resolve(server) == expected


def test_engine_problems_are_one_line_naming_the_keys():
    assert engine_problem({"return_token_ids": True, "engine": "vllm"}) is None
    assert engine_problem({"return_token_ids": True, "engine": "sglang"}) is None  # true = the engine's own ids
    line = engine_problem({"return_token_ids": True, "engine": "llamacpp"})
    assert line.startswith("config key server.return_token_ids: True asks llama.cpp llama-server")
    assert "engines that do: vllm, sglang" in line and "\n" not in line
    line = engine_problem({"return_token_ids": "sglang", "engine": "vllm"})
    assert "names another engine than server.engine: vllm" in line
    assert engine_problem({"return_token_ids": True, "engine": "openai"}).startswith(
        "config key server.return_token_ids: True asks any OpenAI-compatible server")


def test_request_fields_and_stream_options_per_engine():
    assert dialect("vllm").request_fields(True) == {"return_token_ids": True}
    assert dialect("sglang").request_fields(True) == {"return_input_ids_in_sglext": True,
                                                      "return_output_ids_in_sglext": True}
    assert all(d.request_fields(False) == {} for d in DIALECTS.values())
    assert dialect("vllm").stream_options(True) == {"include_usage": True, "continuous_usage_stats": True}
    assert dialect("llamacpp").stream_options(True) == {"include_usage": True}  # not in its schema
    assert dialect("openai").stream_options(False) == {"include_usage": True}


def test_where_each_engine_sends_ids_and_reasoning():
    vllm, sglang, generic = dialect("vllm"), dialect("sglang"), dialect("openai")
    assert vllm.chunk_ids({"prompt_token_ids": [1, 2], "choices": []}) == ([1, 2], None)
    assert vllm.choice_ids({"token_ids": [7], "delta": {}}) == (None, [7])
    assert sglang.chunk_ids({"choices": [], "sglext": {"input_ids": [1], "output_ids": [[5, 6]]}}) == ([1], [5, 6])
    assert sglang.choice_ids({"token_ids": [7]}) == (None, None)  # not SGLang's field
    assert generic.chunk_ids({"prompt_token_ids": [1]}) == (None, None)
    assert vllm.reasoning({"reasoning": "r"}) == "r" and sglang.reasoning({"reasoning": "r"}) is None
    assert generic.reasoning({"reasoning_content": "a"}) == "a" and generic.reasoning({"reasoning": "b"}) == "b"
    assert dialect("llamacpp").reasoning({"reasoning_content": "t", "content": None}) == "t"
    assert sglang.refused_field("return_output_ids_in_sglext is not supported") == "return_output_ids_in_sglext"
    assert generic.refused_field("return_token_ids is not supported") is None


def test_error_objects_of_each_engine_read_the_same():
    d = dialect("openai")
    assert d.error_status({"error": {"code": 400, "message": "x"}}) == 400  # vLLM, llama.cpp
    assert d.error_status({"object": "error", "code": 400, "message": "x"}) == 400  # SGLang
    assert d.error_status({"error": {"code": "503"}}) == 503
    assert d.error_status({"error": "boom"}) is None
    assert d.error_message(b'{"error": {"message": "too long"}}') == "too long"
    assert d.error_message(b"not json" * 100) == ("not json" * 100)[:300]


def test_the_mock_imitates_the_same_releases_as_the_dialects():
    """Every engine with a wire of its own has a mock behaviour of the same release (the mock's table is
    its own, read from the releases, not the product's)."""
    assert set(RELEASED) == set(DIALECTS) - {"openai"} == set(engines.ENGINES) - {"openai"}
    for name, behaviour in RELEASED.items():
        assert behaviour["release"] == DIALECTS[name].imitates
        assert behaviour["reasoning_field"] in DIALECTS[name].reasoning_fields
        assert behaviour["continuous_usage"] == DIALECTS[name].continuous_usage
        assert bool(behaviour["ids"]) == DIALECTS[name].sends_ids


def test_the_schema_offers_exactly_the_dialects():
    import yaml

    from support import REPO

    schema = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
    assert schema["properties"]["server"]["properties"]["engine"]["enum"] == ["auto", *engines.ENGINES]
