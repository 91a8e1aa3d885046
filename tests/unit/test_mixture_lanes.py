"""budgetgen.mixture: lane budgets, the validation split by content, cells' identities and the refusal of a
cell's settings change; budgetgen.forecast: the storage formula."""

import json

import pytest

from budgetgen import mixture
from budgetgen.errors import UserError
from budgetgen.forecast import DumpShape
from budgetgen.identity import Identity, IdentityCount, Policy
from budgetgen.prompts import Prompt
from budgetgen.settings import dataset_mixture, settings_policy


def config(**dataset):
    return {"server": {"model": "m"}, "generation": {"token_budget": 10000, "max_tokens": 100, "temperature": 0.7,
                                                     "top_p": None, "seed": 5, "extra_body": {"x": 1},
                                                     "turns": "last", "history_reasoning": "drop",
                                                     "samples_per_prompt": 1, "on_settings_change": "refuse"},
            "datasets": {"D": {"prompts": "p.jsonl", **dataset}}}


def test_lane_budgets_sum_to_the_budget_and_follow_the_shares():
    assert mixture.split_budgets(10001, [0.7, 0.3], 0.05) == [(6651, 350), (2850, 150)]
    assert sum(sum(b) for b in mixture.split_budgets(10001, [0.7, 0.3], 0.05)) == 10001
    assert mixture.split_budgets(100, [1.0], 0) == [(100, 0)]


def test_a_dataset_without_a_mixture_is_one_cell_with_the_datasets_identity():
    from budgetgen.settings import generation_identity

    mix = dataset_mixture(config(), "D")
    assert mix.plain and [c.name for c in mix.cells] == ["default"] and mix.layout_sha() is None
    assert mix.cells[0].identity == generation_identity(config(), "D")
    from budgetgen.identity import gates_sha
    from budgetgen.quality import Gate

    assert settings_policy(config(), "D").key() == {"identity": mix.cells[0].identity.sha, "layout": None,
                                                  "on_settings_change": "refuse",
                                                  "quality": gates_sha([("default", Gate().describe())])}


def test_cells_merge_their_overrides_over_the_datasets_settings():
    mix = dataset_mixture(config(extra_body={"chat_template_kwargs": {"reasoning_effort": "high"}}, mixture={
        "think": {"share": 0.7, "extra_body": {"chat_template_kwargs": {"enable_thinking": True}}},
        "nothink": {"share": 0.3, "temperature": 0.6, "max_tokens": 50,
                    "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}},
                                 validation={"share": 0.1}), "D")
    think, nothink = mix.cells
    assert think.params["extra_body"] == {"chat_template_kwargs": {"reasoning_effort": "high", "enable_thinking": True}}
    assert nothink.params["temperature"] == 0.6 and nothink.max_tokens == 50 and think.params["temperature"] == 0.7
    assert think.identity.sha != nothink.identity.sha
    assert mix.budgets() == {"think": 6300, "nothink": 2700, "think/validation": 700, "nothink/validation": 300}


def test_the_split_is_a_seeded_function_of_the_content_not_the_id():
    mix = mixture.Mixture.of([], 0, 0.3, 7)
    msgs = ({"role": "user", "content": "hello there"},)
    assert all(mix.split_of(msgs) == mix.split_of(tuple(dict(m) for m in msgs)) for _ in range(3))
    prompts = [Prompt(f"id{i}", ({"role": "user", "content": f"q {i}"},), i) for i in range(2000)]
    held = [p for p in prompts if mix.split_of(p.messages) == "validation"]
    assert 0.25 < len(held) / 2000 < 0.35  # the share, as a hash draws it (5 standard deviations)
    again = [Prompt(f"other{i}", p.messages, 0) for i, p in enumerate(held[:20])]
    assert all(mix.split_of(p.messages) == "validation" for p in again)  # duplicates under other ids
    reseeded = mixture.Mixture.of([], 0, 0.3, 8)
    assert {p.id for p in held} != {p.id for p in prompts if reseeded.split_of(p.messages) == "validation"}
    assert mixture.Mixture.of([], 0, 0.0, 7).split_of(msgs) == "train"


def test_a_cells_changed_settings_are_refused_naming_the_cell():
    think, nothink = Identity.of({"temperature": 0.7}), Identity.of({"temperature": 0.6})
    policy = Policy(think, cells=(("think", think), ("nothink", nothink)), layout="x")
    old = Identity.of({"temperature": 0.5})
    journal = {think.sha: IdentityCount(3, 30, think.settings, "think"),
               old.sha: IdentityCount(2, 20, old.settings, "nothink")}
    assert policy.changes(journal) == ["cell nothink: temperature 0.5 -> 0.6"]
    journal[nothink.sha] = IdentityCount(1, 10, nothink.settings, "nothink")  # decided earlier (regenerate)
    assert policy.changes(journal) is None
    assert policy.cell_of(nothink.sha) == "nothink" and policy.cell_of(old.sha, "nothink") == "nothink"
    assert policy.cell_of(old.sha, "gone") == "think"
    assert policy.accepts(think.sha) and not policy.accepts(old.sha)


def test_the_forecast_is_row_tokens_times_layers_times_hidden_times_bytes(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 7168, "num_hidden_layers": 61}))  # DeepSeek-V3's shape
    shape = DumpShape.from_config_file(cfg)
    assert shape.bytes_for(1000) == 1000 * (3 + 1) * 7168 * 2
    vl = tmp_path / "vl.json"
    vl.write_text(json.dumps({"text_config": {"hidden_size": 2048, "num_hidden_layers": 28}}))
    assert DumpShape.from_config_file(vl, aux_layers=2, dtype_bytes=4).bytes_for(10) == 10 * 3 * 2048 * 4
    assert DumpShape.from_config_file(tmp_path / "config.json.missing") is None
    with pytest.raises(UserError, match="tokenizer.model_config: file not found"):
        DumpShape.from_config_file(tmp_path / "missing.json", required=True)


def test_a_lane_under_two_max_tokens_is_warned_in_one_line_per_dataset():
    from budgetgen.configcheck import small_lane_warning

    cells = {"think": {"share": 0.7, "temperature": 0.9}, "nothink": {"share": 0.3, "temperature": 0.6}}
    # 10000 x 0.05 validation: nothink/validation 150 is under 2 x max_tokens 100, think/validation 350 is not
    line = small_lane_warning(config(mixture=cells, validation={"share": 0.05}))
    assert line.count("\n") == 0 and line.startswith("warning: dataset D: lines under 2 x max_tokens: ")
    assert "nothink/validation 150 tokens (max_tokens 100: up to 167 %)" in line
    assert " think/validation" not in line and "think 6650" not in line
    assert small_lane_warning(config(mixture=cells, validation={"share": 0.2})) is None
    assert small_lane_warning(config(token_budget=150)) is None  # one lane: its budget is the user's to choose


def test_a_mixture_key_names_its_identity_and_its_layout_apart():
    """Policy.key(): the identity under `identity`, the mixture's lanes under `layout` (identity.layout_sha),
    each its own fingerprint; a status of another layout is not trusted."""
    from budgetgen.state import counted_under

    cfg = config()
    cfg["datasets"]["D"]["mixture"] = {"a": {"share": 0.5, "temperature": 0.1}, "b": {"share": 0.5}}
    key = settings_policy(cfg, "D").key()
    mix = dataset_mixture(cfg, "D")
    assert key["identity"] == mix.cells[0].identity.sha and key["layout"] == mix.layout_sha() != key["identity"]
    assert counted_under(dict(key), key) and not counted_under({**key, "layout": "0" * 16}, key)


def test_a_rules_declared_files_replace_the_default_paths_and_unknown_names_are_one_line():
    from budgetgen.errors import UserError
    from budgetgen.paths import DatasetPaths

    p = DatasetPaths.of(config(), "D")
    assert p.raw_responses == "results/D/raw_responses.jsonl" == DatasetPaths.PATTERNS["raw_responses"].format(
        dataset="D")
    assert p.with_files({"raw_responses": "elsewhere.jsonl"}).raw_responses == "elsewhere.jsonl"
    with pytest.raises(UserError, match=r"--path bogus=\.\.\.: not a file of a dataset"):
        p.with_files({"bogus": "x"})
