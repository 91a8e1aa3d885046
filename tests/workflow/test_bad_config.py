"""Bad config catalogue (docs/reliability.md, "Bad config"): each case is refused by a real
`snakemake` run with one line naming the key, before any job starts (nothing under results/,
logs/ or benchmarks/)."""

import pytest

from support.workflow import Workflow, base_config, write_prompts

pytestmark = pytest.mark.slow


def make(tmp_path, tokenizer, **gen):
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "A.jsonl", 3)
    return Workflow(wf_dir, base_config("http://127.0.0.1:9/v1", tokenizer, {"A": {"prompts": "prompts/A.jsonl"}},
                                        **gen))


def refused(wf, expected, *args, env=None, prefix=False):
    """Run `snakemake --cores 1 all` (or args): it fails with `expected` as one whole line of its
    stderr (of its output for a dry-run, which snakemake logs to stdout) or the start of one, with
    prefix; no Python traceback; no job ran."""
    p = wf.run(*(args or ("--cores", "1", "all")), check=False, env=env)
    assert p.returncode != 0, p.output[-3000:]
    lines = (p.output if "-n" in args else p.stderr).splitlines()
    assert any(line == expected or (prefix and line.startswith(expected)) for line in lines), p.output[-3000:]
    assert "Traceback" not in p.output
    for d in ("results", "logs", "benchmarks"):
        assert not wf.path(d).exists(), f"{d}/ exists: a job ran"
    return p


@pytest.mark.parametrize("where, key, expected", [
    ((), "bogus", "config key bogus: unknown key (known keys: datasets, generation, server, tokenizer)"),
    (("generation",), "max_token", "config key generation.max_token: unknown key"),
    (("datasets", "A"), "prompt", "config key datasets.A.prompt: unknown key"),
], ids=["top-level", "typo-in-generation", "typo-in-dataset"])
def test_unknown_key(tmp_path, tiny_tokenizer, where, key, expected):
    wf = make(tmp_path, tiny_tokenizer)
    node = wf.config
    for part in where:
        node = node[part]
    node[key] = 1
    wf.write_config()
    refused(wf, expected, prefix=True)


@pytest.mark.parametrize("section, key, value, expected", [
    ("generation", "concurrency", "many", "config key generation.concurrency: 'many' is not of type 'integer'"),
    ("generation", "temperature", "hot", "config key generation.temperature: 'hot' is not of type 'number', 'null'"),
    ("server", "request_timeout_s", [1], "config key server.request_timeout_s: [1] is not of type 'number'"),
    ("tokenizer", "max_length", 1.5, "config key tokenizer.max_length: 1.5 is not of type 'integer'"),
    ("generation", "extra_body", {"chat_template_kwargs": "enable_thinking"},
     "config key generation.extra_body.chat_template_kwargs: 'enable_thinking' is not of type 'object'"),
], ids=["string-for-int", "string-for-number", "list-for-number", "float-for-int", "chat-template-kwargs-not-object"])
def test_wrong_type(tmp_path, tiny_tokenizer, section, key, value, expected):
    wf = make(tmp_path, tiny_tokenizer)
    wf.config[section][key] = value
    wf.write_config()
    refused(wf, expected)


@pytest.mark.parametrize("budget", [0, -5])
def test_zero_or_negative_budget(tmp_path, tiny_tokenizer, budget):
    wf = make(tmp_path, tiny_tokenizer, token_budget=budget)
    refused(wf, f"config key generation.token_budget: {budget} is less than the minimum of 1")
    wf.config["generation"]["token_budget"] = 100
    wf.config["datasets"]["A"]["token_budget"] = budget  # the per-dataset override too
    wf.write_config()
    refused(wf, f"config key datasets.A.token_budget: {budget} is less than the minimum of 1")


def test_concurrency_zero(tmp_path, tiny_tokenizer):
    wf = make(tmp_path, tiny_tokenizer, concurrency=0)
    refused(wf, "config key generation.concurrency: 0 is less than the minimum of 1")
    wf.config["generation"]["concurrency"] = 4
    wf.config["datasets"]["A"]["concurrency"] = 0
    wf.write_config()
    refused(wf, "config key datasets.A.concurrency: 0 is less than the minimum of 1")


def test_missing_tokenizer_path(tmp_path, tiny_tokenizer, monkeypatch):
    wf = make(tmp_path, tmp_path / "no-such-tokenizer")
    refused(wf, f"config key tokenizer.path: no such folder: {tmp_path / 'no-such-tokenizer'}")
    # a hub name (org/model) must be in the local cache: an empty cache here
    wf.config["tokenizer"]["path"] = "no-such-org/no-such-model"
    wf.write_config()
    refused(wf, "config key tokenizer.path: no such folder, and not in the local Hugging Face cache: "
                "no-such-org/no-such-model", env={"HF_HUB_CACHE": str(tmp_path / "empty-hub-cache")})
    # a dry-run (and --lint) still works: the check is made when jobs are about to run
    assert wf.run("-n", "all").returncode == 0


@pytest.mark.parametrize("name", ["a/b", "../escape", "..", ".hidden", "a b"])
def test_dataset_name_with_slash_or_dots(tmp_path, tiny_tokenizer, name):
    wf = make(tmp_path, tiny_tokenizer)
    wf.config["datasets"][name] = {"prompts": "prompts/A.jsonl"}
    wf.write_config()
    refused(wf, f"config key datasets: invalid name: {name!r} does not match '^[A-Za-z0-9][A-Za-z0-9_.-]*$'")


DUPLICATE_DATASET = """\
server: {{base_url: "http://127.0.0.1:9/v1", model: mock-model}}
generation: {{token_budget: 100}}
tokenizer: {{path: "{tok}"}}
datasets:
  A:
    prompts: prompts/A.jsonl
  B: {{prompts: prompts/A.jsonl}}
  A:
    prompts: prompts/A.jsonl
    token_budget: 50
"""

DUPLICATE_SETTING = """\
server: {{base_url: "http://127.0.0.1:9/v1", model: mock-model}}
generation:
  token_budget: 100
  max_tokens: 64
  token_budget: 100000
tokenizer: {{path: "{tok}"}}
datasets: {{A: {{prompts: prompts/A.jsonl}}}}
"""


@pytest.mark.parametrize("text, expected", [
    (DUPLICATE_DATASET, ":8: duplicate config key datasets.A (first given on line 5); "
                        "YAML would silently keep only the last one"),
    (DUPLICATE_SETTING, ":5: duplicate config key generation.token_budget (first given on line 3); "
                        "YAML would silently keep only the last one"),
], ids=["dataset-name", "generation-key"])
def test_duplicate_keys(tmp_path, tiny_tokenizer, text, expected):
    wf = make(tmp_path, tiny_tokenizer)
    wf.path("config.yaml").write_text(text.format(tok=tiny_tokenizer))
    refused(wf, f"{wf.path('config.yaml')}{expected}")
    refused(wf, f"{wf.path('config.yaml')}{expected}", "-n", "all")
    # a YAML merge key (<<) that a key beside it overrides is not a duplicate
    wf.path("config.yaml").write_text(
        "server: {base_url: 'http://127.0.0.1:9/v1', model: mock-model}\n"
        "generation: &g {token_budget: 100, max_tokens: 64}\n"
        f"tokenizer: {{path: '{tiny_tokenizer}'}}\n"
        "datasets: {A: {<<: *g, prompts: prompts/A.jsonl, token_budget: 200}}\n")
    assert "budgetgen: A" in wf.run("-n", "all").output


@pytest.mark.parametrize("url", ["127.0.0.1:8000/v1", "localhost:8000/v1", "ftp://host/v1", "http:/host/v1"])
def test_url_without_scheme(tmp_path, tiny_tokenizer, url):
    wf = make(tmp_path, tiny_tokenizer)
    wf.config["server"]["base_url"] = url
    wf.write_config()
    refused(wf, f"config key server.base_url: {url!r} does not match '^https?://[^\\\\s]+$'")


EXTRA_BODY_REFUSED = {  # key -> why, in the error line
    "max_tokens": "set {section}.max_tokens",
    "max_completion_tokens": "set {section}.max_tokens",
    "stream": "budgetgen always streams",
    "stream_options": "budgetgen sets it, to count usage",
    "n": "budgetgen asks for one response per request",
    "model": "set server.model",
    "messages": "the prompts file gives them",
    "return_token_ids": "set server.return_token_ids: vllm",
    "return_input_ids_in_sglext": "set server.return_token_ids: sglang",
}


@pytest.mark.parametrize("key", list(EXTRA_BODY_REFUSED))
def test_extra_body_cannot_override_request_fields(tmp_path, tiny_tokenizer, key):
    # merged last into each request, extra_body would silently replace what budgetgen sets
    wf = make(tmp_path, tiny_tokenizer, extra_body={"chat_template_kwargs": {"enable_thinking": True}, key: 1})
    refused(wf, f"config key generation.extra_body.{key}: not allowed here "
            f"({EXTRA_BODY_REFUSED[key].format(section='generation')})",
            "-n", "all")


def test_extra_body_of_a_dataset_cannot_override_request_fields(tmp_path, tiny_tokenizer):
    wf = make(tmp_path, tiny_tokenizer)
    wf.config["datasets"]["A"]["extra_body"] = {"top_k": 20, "max_tokens": 64}
    wf.write_config()
    refused(wf, "config key datasets.A.extra_body.max_tokens: not allowed here (set datasets.A.max_tokens)",
            "-n", "all")
    del wf.config["datasets"]["A"]["extra_body"]["max_tokens"]
    wf.write_config()
    assert wf.run("-n", "all").returncode == 0  # other keys pass


def test_token_budget_required_only_for_datasets_without_one(tmp_path, tiny_tokenizer):
    wf = make(tmp_path, tiny_tokenizer)
    write_prompts(wf.path("prompts", "B.jsonl"), 3)
    del wf.config["generation"]["token_budget"]
    wf.config["datasets"]["A"]["token_budget"] = 500
    wf.config["datasets"]["B"] = {"prompts": "prompts/B.jsonl", "token_budget": 700}
    wf.write_config()
    out = wf.run("-n", "all").output  # per-dataset budgets only: accepted
    out = out.split("budgetgen: remaining", 1)[0]  # the status table (the estimate's lines follow it)
    assert [line.split()[1:4:2] for line in out.splitlines() if line.startswith("budgetgen: ") and
            line.split()[1] in ("A", "B")] == [["A", "500"], ["B", "700"]]
    del wf.config["generation"]  # nor is the section itself needed
    wf.write_config()
    assert wf.run("-n", "all").returncode == 0
    wf.config["datasets"]["B"].pop("token_budget")  # B has none, and there is no default
    wf.write_config()
    refused(wf, "config key generation.token_budget (or datasets.B.token_budget) is required", "-n", "all")


@pytest.mark.parametrize("mixture, validation, expected", [
    ({"a": {"share": 0.6, "temperature": 0.5}, "b": {"share": 0.3, "temperature": 0.9}}, None,
     "config key datasets.A.mixture: the cells' shares sum to 0.9, not 1"),
    ({"a": {"share": 0.5, "temperature": 0.5}, "b": {"share": 0.5, "temperature": 0.5}}, None,
     "config key datasets.A.mixture: cells a and b have the same generation settings (dataset A); give each cell "
     "the settings that make it a cell"),
    ({"a": {"share": 1, "seed": 3}}, None, "config key datasets.A.mixture.a.seed: unknown key (known keys: "
     "extra_body, history_reasoning, max_tokens, quality, samples_per_prompt, share, temperature, thinking_budget, "
     "top_p, turns)"),
    ({"a": {"temperature": 0.5}}, None, "config key datasets.A.mixture.a.share: required key is missing"),
    (None, {"share": 1}, "config key datasets.A.validation.share: 1 is greater than or equal to the maximum of 1"),
])
def test_bad_mixture_or_validation(tmp_path, tiny_tokenizer, mixture, validation, expected):
    wf = make(tmp_path, tiny_tokenizer)
    if mixture is not None:
        wf.config["datasets"]["A"]["mixture"] = mixture
    if validation is not None:
        wf.config["datasets"]["A"]["validation"] = validation
    wf.write_config()
    refused(wf, expected)


def test_model_config_that_is_not_there(tmp_path, tiny_tokenizer):
    wf = make(tmp_path, tiny_tokenizer)
    wf.config["tokenizer"]["model_config"] = "nowhere/config.json"
    wf.write_config()
    refused(wf, "config key tokenizer.model_config: file not found: nowhere/config.json (relative paths in the "
            "config are read from the working directory", prefix=True)
