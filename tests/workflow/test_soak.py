"""The kill-anywhere soak (tests/soak/soak.py), CI-sized: four datasets (one multi-turn, `turns: all` with 2
samples), stage 1 run to the end, then a settings change (temperature, `on_settings_change: regenerate`): an
uninterrupted reference run of stage 2, then three trials whose first kill -9 of the snakemake process group
falls at a point of the trial's own progress: mid-inference (a drawn number of journal lines written), while a
tokenize job runs, while an export job runs (the tail); never at a time taken from the reference run's clock,
which a loaded machine stretches or shrinks. Each is rerun with --unlock, killed again (first trial, by time)
or left to finish. The full soak runs on demand: `.venv/bin/python tests/soak/soak.py --trials 50`. The mock
server answers 4 of the 56 prompts with HTTP 400 (--fail-400), so every run also appends permanent errors to
errors.jsonl, checked after every kill like the journal."""

import random

import pytest
from soak import soak as soak_mod

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("soak")]  # one reference run for the module


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    s = soak_mod.Soak(tmp_path_factory.mktemp("soak"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def reference(soak):
    return soak.reference()


def test_uninterrupted_reference_run_exhausts_every_dataset(soak, reference):
    for ds, n in soak_mod.DATASETS.items():  # every generation answered or errored (HTTP 400), none both
        errors = soak.ref_errors[ds]
        assert not set(errors) & set(reference[ds]["raw"])
        rows = len(reference[ds]["tokenized"]) + len(reference[ds].get("validation", ()))  # X: both splits
        assert len(reference[ds]["raw"]) == rows
        if ds not in soak_mod.MULTI_TURN:
            assert (errors or ds in soak_mod.MIXTURE) and len(reference[ds]["raw"]) == n - len(errors)
    # the mixture: both cells and both splits made, every record in the split of its row file
    x = reference["X"]
    assert {r["cell"] for r in x["raw"].values()} == set(soak_mod.MIXTURE["X"]["mixture"])
    assert x["validation"] and all(x["raw"][i]["split"] == "validation" for i in x["validation"])
    # the multi-turn dataset: every turn of both samples, on-policy, unless an error ended its conversation
    assert any(rid.endswith("/s2/t3") for rid in reference["M"]["raw"])
    # stage 2 regenerated everything under its new identity: the rows are the new settings', the stage 1
    # records are still in the journal
    meta = reference["A"]["meta"]["generation_settings"]
    assert len(meta) == 1 and meta[0]["settings"]["temperature"] == soak_mod.CHANGE["temperature"]
    assert soak.ref_s > 0


@pytest.mark.parametrize("third", [0, 1, 2])
def test_kill_9_anywhere_then_rerun_preserves_journal_and_equals_uninterrupted_run(soak, reference, third):
    # a second kill only in the first trial (its first kill comes early): each test stays under a minute. The
    # first kill waits for the trial's own progress, so it lands however fast or slow the machine runs
    rng = random.Random(100 + third)
    point = soak.progress_point(third, rng)
    r = soak.trial(100 + third, max_kills=2 if third == 0 else 1, first=point)
    assert r["passed"], "\n".join(r["failures"])
    assert r["kills"], f"the run ended before reaching {point}"
    first = r["kills"][0]
    assert first["trigger"] == list(point)
    if point[0] == "phase":
        assert point[1] in first["phase"].split("+")  # the kill cut that step
    else:
        assert "inference" in first["phase"]
    assert r["runs"] == len(r["kills"]) + 1
    print(f"kills: {r['kills']}")


def test_invariant_checks_catch_a_lost_record_a_duplicate_and_changed_content(soak, reference):
    """The checks the trials rely on are not vacuous."""
    import copy
    import json

    wf = soak.workflow("checks", stage=1)  # a fresh folder: no outputs of its own
    good = {ds: {"lines": [json.dumps({"id": f"{ds}{i}"}).encode() + b"\n" for i in range(3)], "torn": 0}
            for ds in soak_mod.DATASETS}
    lost = copy.deepcopy(good)
    del lost["A"]["lines"][1]
    assert any("prefix not preserved" in f for f in soak_mod.check_after_kill(wf, good, lost))
    twice = copy.deepcopy(good)
    twice["B"]["lines"].append(twice["B"]["lines"][0])
    assert any("ids twice in the journal" in f for f in soak_mod.check_after_kill(wf, good, twice))
    # errors.jsonl: a record glued onto a torn one, an id errored twice, an id journaled and errored
    err = {ds: dict(good[ds], error_lines=[json.dumps({"id": f"{ds}e"}).encode() + b"\n"]) for ds in good}
    glued = copy.deepcopy(err)
    glued["A"]["error_lines"].append(b'{"id": "Ax", "messages": [{"ro{"id": "Ay"}\n')
    assert any("errors.jsonl line does not parse" in f for f in soak_mod.check_after_kill(wf, err, glued))
    twice = copy.deepcopy(err)
    twice["B"]["error_lines"].append(twice["B"]["error_lines"][0])
    assert any("errored twice" in f for f in soak_mod.check_after_kill(wf, err, twice))
    both = copy.deepcopy(err)
    both["C"]["error_lines"].append(json.dumps({"id": "C0"}).encode() + b"\n")
    assert any("both journaled and errored" in f for f in soak_mod.check_after_kill(wf, err, both))
    lost = copy.deepcopy(err)
    lost["A"]["error_lines"] = []
    assert any("errors.jsonl prefix not preserved" in f for f in soak_mod.check_after_kill(wf, err, lost))
    assert soak_mod.check_after_kill(wf, err, copy.deepcopy(err)) == []
    changed = copy.deepcopy(reference)
    rid = next(iter(changed["C"]["raw"]))
    changed["C"]["raw"][rid]["messages"][-1]["content"] += " extra"
    assert any("raw content differs" in f for f in soak_mod.compare_final(changed, reference))
    assert soak_mod.compare_final(copy.deepcopy(reference), reference) == []
    # the mixture's invariants: a record in another split, a validation row lost
    moved = copy.deepcopy(reference)
    rid = next(iter(moved["X"]["raw"]))
    moved["X"]["raw"][rid]["split"] = "validation" if moved["X"]["raw"][rid]["split"] == "train" else "train"
    assert any("split" in f for f in soak_mod.compare_final(moved, reference))
    short = copy.deepcopy(reference)
    short["X"]["validation"].pop(next(iter(short["X"]["validation"])))
    assert any("validation rows are not the validation records" in f for f in soak_mod.compare_final(short, reference))
