"""Issue 29 point 2: a chat_template_kwargs key the target's chat template does not read is refused by
`snakemake -n` at parse time (budgetgen.template_check), one line naming the key; the escape hatch
tokenizer.check_template_kwargs: false lets it through."""

import pytest

from support.workflow import Workflow, base_config, write_prompts

pytestmark = pytest.mark.slow


def test_dry_run_refuses_a_misspelled_template_kwarg_of_a_cell(tmp_path, tiny_tokenizer):
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "A.jsonl", 3)
    mixture = {"think": {"share": 0.5, "extra_body": {"chat_template_kwargs": {"enable_thinking": True}}},
               "nothink": {"share": 0.5, "extra_body": {"chat_template_kwargs": {"enable_thinkng": False}}}}
    wf = Workflow(wf_dir, base_config("http://127.0.0.1:9/v1", tiny_tokenizer,
                                      {"A": {"prompts": "prompts/A.jsonl", "mixture": mixture}}))
    p = wf.run("-n", "all", check=False)
    assert p.returncode != 0, p.output[-3000:]
    expected = ("config key datasets.A.mixture.nothink.extra_body.chat_template_kwargs.enable_thinkng: the chat "
                f"template of tokenizer.path ({tiny_tokenizer}) does not read enable_thinkng (did you mean "
                "enable_thinking? it reads: enable_thinking); set tokenizer.check_template_kwargs: false only if the "
                "server renders with a chat template of its own (--chat-template) that tokenizer.path does not have")
    assert expected in p.output.splitlines(), p.output[-3000:]
    assert "Traceback" not in p.output
    for d in ("results", "logs", "benchmarks"):
        assert not wf.path(d).exists(), f"{d}/ exists: a job ran"

    wf.config["tokenizer"]["check_template_kwargs"] = False  # the server renders with a template of its own
    wf.write_config()
    assert wf.run("-n", "all").returncode == 0
