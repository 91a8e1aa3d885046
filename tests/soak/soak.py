#!/usr/bin/env python3
"""Kill-anywhere soak: kill -9 the whole snakemake process group at random moments, rerun, repeat.

    .venv/bin/python tests/soak/soak.py --trials 50            # on demand; prints "trials passed/run"

One deterministic mock server (responses seeded by the messages) serves every run; it answers a
share of the requests (--fail-400, 5 %, chosen by a hash of the messages and the fault seed, so the
same requests on every run) with HTTP 400 and a 64 KB error message, so every run also appends
permanent errors to results/D/errors.jsonl, and 5 % HTTP 500s and 5 % dropped streams (FAULTS,
retried). Five datasets: three of single prompts; M, multi-turn conversations generated on-policy
(`turns: all`, 2 samples per prompt; a 400 on a later turn ends its conversation); X, a two-cell
mixture with a validation split (MIXTURE: checked by invariants, its cells depend on timing). Each is
*exhausted* (the budget is larger than all its generations, so the set of ids generated does not
depend on timing). The targets are every dataset's tokenized.arrow and its exports.

A settings change between runs (--settings-change, the default): stage 1 runs the workflow to the end
under the first settings on two thirds of each dataset's prompts (STAGE1_SHARE); stage 2 has all of
them and changes a setting of the generation identity (temperature 0.5) with `on_settings_change:
regenerate` (every generation made again under the new identity beside the old records in the same
journal) or `extend` (--change extend: the old records stay in the outputs, the new prompts are made
under the new identity). The uninterrupted reference run of stage 2 (on a copy of stage 1's
finished folder) gives the final outputs and the span of one run. Each trial then starts stage 2 on a
fresh copy of stage 1's folder (with --no-settings-change: the single stage in a fresh folder),
kills the process group (snakemake and every job it runs) after a delay drawn uniformly from that
span (so kills fall in inference, finalize, tokenize or snakemake's own bookkeeping in proportion to
the time each takes), reruns with `--unlock` first (kill -9 leaves Snakemake's lock behind), kills
again with probability --again (at most --max-kills per trial) or lets it finish.

Checked after every kill: no process of the group survives; every whole journal line present before
the kill is still there, in order (prefix preserved); no id twice under one identity in any journal;
errors.jsonl likewise: its whole lines from before the kill kept in order, every whole line parses, no
id errored twice under one identity, no id both journaled and errored under one identity (a torn tail, a \
record the kill cut, is counted; the rerun
must cut it, never glue a record onto it); a raw_responses.jsonl or tokenized.arrow that exists is
whole (parses / opens with datasets.Dataset.from_file) with no id twice. Checked at the end: the
journals and errors.jsonl hold exactly the reference ids under the final identity, and
raw_responses.jsonl and tokenized.arrow equal the reference (per id; timing fields created/latency_s/attempts ignored;
the Arrow provenance metadata compared too).

--inference-share S draws that share of the kill delays from the reference's inference span (its start
to the last inference.done) instead of its whole span: more kills mid-stream and mid-conversation (a
kill's mid_conversations: M's conversations journaled in part).

Appends one JSON result line to --results (default tests/soak/results.jsonl). tests/workflow/test_soak.py
runs three trials of this in CI.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
for _p in (str(TESTS), str(TESTS.parent / "scripts")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from budgetgen.conversations import record_place  # noqa: E402
from budgetgen_testkit import mock_server  # noqa: E402
from support import CORPUS  # noqa: E402
from support.workflow import Workflow, base_config, write_conversations, write_prompts  # noqa: E402

DATASETS = {"A": 24, "B": 16, "C": 16, "M": 6, "X": 24}  # prompts per dataset (stage 2; stage 1: STAGE1_SHARE)
MULTI_TURN = {"M": {"turns": "all", "samples_per_prompt": 2}}  # M: 3-turn conversations, every turn on-policy
# X: a two-cell mixture with a validation split. Which cell claims a prompt depends on which lane is furthest
# from its line when a prompt is needed (timing), so X is compared by invariants, not to the reference: each
# prompt once, in a cell of X, in the split the content hash gives; a prompt in the reference's cell has the
# reference's record; rows and exports are the raw records of their split.
MIXTURE = {"X": {"mixture": {"short": {"share": 0.5, "max_tokens": 48}, "long": {"share": 0.5, "max_tokens": 96}},
                 "validation": {"share": 0.25}}}
CHANGES = {"regenerate": {"temperature": 0.5, "on_settings_change": "regenerate"},  # stage 2's settings change
           "extend": {"temperature": 0.5, "on_settings_change": "extend"}}
CHANGE = CHANGES["regenerate"]
STAGE1_SHARE = 2 / 3  # stage 1 answers this share of each dataset's prompts; stage 2 adds the rest
FAULTS = {"--fail-500": 0.05, "--drop": 0.05}  # retried server faults on every run: HTTP 500s, dropped streams
FAIL_400 = 0.05  # share of prompts answered HTTP 400 (permanent errors); fault seed 7: 1, 2 and 1 of them
FAULT_SEED = 7
ERROR_BYTES = 65536  # the 400's error message
TIMING_FIELDS = ("created", "latency_s", "attempts")
PHASES = {"run_inference.py": "inference", "finalize.py": "finalize", "tokenize_responses.py": "tokenize",
          "budget_status.py": "budget_status", "export_dataset.py": "export"}


# -- processes -------------------------------------------------------------------------------------
def group_members(pgid):
    """Live (non-zombie) processes of process group pgid: [(pid, cmdline)]."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
            if int(pgrp) != pgid or state in ("Z", "X"):
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        found.append((int(name), cmd))
    return found


def phases_of(members):
    """The workflow steps running among these processes (by script name), or 'snakemake' if none."""
    got = sorted({phase for _, cmd in members for script, phase in PHASES.items() if script in cmd})
    return "+".join(got) or "snakemake"


def wait_group_gone(pgid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return []
        time.sleep(0.05)
    return group_members(pgid)


def wait_for_progress(proc, wf, trigger, start_lines, timeout, poll_s=0.05):
    """Wait until the run `proc` reaches a point of its own progress (trigger: ("records", k), k more whole
    journal lines than start_lines; ("phase", p), a job of step p running in its process group) or ends.
    True once the point is reached or the run ended (proc.poll() tells which), False after timeout s."""
    kind, value = trigger
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if kind == "records" and journal_lines(wf.dir) - start_lines >= value:
            return True
        if kind == "phase" and value in phases_of(group_members(proc.pid)).split("+"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


# -- outputs ---------------------------------------------------------------------------------------
def journal_lines(folder):
    """Whole lines in every dataset's journal in a working folder (a torn tail not counted)."""
    n = 0
    for ds in DATASETS:
        p = Path(folder, "results", ds, "journal.jsonl")
        if p.exists():
            n += p.read_bytes().count(b"\n")
    return n


def journal_snapshot(wf):
    """Per dataset: the whole journal lines, and the bytes of a torn tail (a line cut by the kill);
    the same for errors.jsonl (error_lines, error_torn)."""
    snap = {}
    for ds in DATASETS:
        snap[ds] = {}
        for name, lines, torn in (("journal.jsonl", "lines", "torn"), ("errors.jsonl", "error_lines", "error_torn")):
            p = wf.path("results", ds, name)
            data = p.read_bytes() if p.exists() else b""
            whole = data[: data.rfind(b"\n") + 1]
            snap[ds][lines], snap[ds][torn] = whole.splitlines(keepends=True), len(data) - len(whole)
    return snap


def load_jsonl(path):
    """Every line of a file that must be whole: [record]; raises on a torn or bad line."""
    data = Path(path).read_bytes()
    if data and not data.endswith(b"\n"):
        raise ValueError(f"{path}: last line not terminated")
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def error_ids(wf, identities=None):
    """Per dataset: the sorted ids of errors.jsonl (every line must parse), of the dataset's identity in
    `identities` when given."""
    out = {}
    for ds in DATASETS:
        p = wf.path("results", ds, "errors.jsonl")
        recs = load_jsonl(p) if p.exists() else []
        out[ds] = sorted(r["id"] for r in recs if identities is None or r.get("identity") in identities[ds])
    return out


def duplicates(ids):
    return sorted(i for i, n in Counter(ids).items() if n > 1)


def keyed(lines):
    """(identity, id) of each whole line: one id may be journaled once per identity (a regenerate run)."""
    out = []
    for line in lines:
        rec = json.loads(line)
        out.append((rec.get("identity"), rec["id"]))
    return out


def normal(rec):
    return {k: v for k, v in rec.items() if k not in TIMING_FIELDS}


def load_tokenized(path):
    """(rows by id, provenance metadata) of a tokenized.arrow, opened as training code opens it."""
    import pyarrow as pa
    from datasets import Dataset

    rows = Dataset.from_file(str(path)).to_list()
    with pa.memory_map(str(path)) as f:
        meta = pa.ipc.open_stream(f).schema.metadata or {}
    by_id = {r["id"]: r for r in rows}
    if len(by_id) != len(rows):
        raise ValueError(f"{path}: ids twice: {duplicates([r['id'] for r in rows])[:5]}")
    return by_id, json.loads(meta.get(b"budgetgen", b"{}"))


def exports(ds):
    """The export files of a dataset (one per split) the soak builds and checks."""
    return [f"results/{ds}/export/specforge.jsonl"] + (
        [f"results/{ds}/export/validation/specforge.jsonl"] if ds in MIXTURE else [])


def final_outputs(wf):
    """Per dataset: {raw: {id: record without timing}, tokenized: {id: row}, meta: {...}, validation (a
    split's rows), exported: {file: ids}}."""
    out = {}
    for ds in DATASETS:
        raw = load_jsonl(wf.path("results", ds, "raw_responses.jsonl"))
        tok, meta = load_tokenized(wf.path("results", ds, "tokenized.arrow"))
        out[ds] = {"raw": {r["id"]: normal(r) for r in raw}, "raw_ids": [r["id"] for r in raw],
                   "tokenized": tok, "meta": meta,
                   "exported": {f: sorted(r["id"] for r in load_jsonl(wf.path(f))) for f in exports(ds)}}
        if ds in MIXTURE:
            out[ds]["validation"] = load_tokenized(wf.path("results", ds, "validation.arrow"))[0]
    return out


def check_after_kill(wf, before, now):
    """Invariants that must hold at any moment a kill can leave behind."""
    bad = []
    for ds in DATASETS:
        old, new = before[ds]["lines"], now[ds]["lines"]
        if new[: len(old)] != old:
            bad.append(f"{ds}: journal prefix not preserved ({len(old)} whole lines before, {len(new)} now)")
        try:
            ids = keyed(new)
        except ValueError as exc:
            bad.append(f"{ds}: a whole journal line does not parse: {exc}")
            continue
        if duplicates(ids):
            bad.append(f"{ds}: ids twice in the journal: {duplicates(ids)[:5]}")
        bad += [f"{ds}: {f}" for f in check_errors(before[ds], now[ds], set(ids))]
        raw = wf.path("results", ds, "raw_responses.jsonl")
        if raw.exists():
            try:
                rids = [r["id"] for r in load_jsonl(raw)]
                if duplicates(rids):
                    bad.append(f"{ds}: ids twice in raw_responses.jsonl: {duplicates(rids)[:5]}")
                if not set(rids) <= {i for _, i in ids}:
                    bad.append(f"{ds}: raw_responses.jsonl holds ids the journal lacks")
            except ValueError as exc:
                bad.append(f"{ds}: raw_responses.jsonl not whole: {exc}")
        for name in ("tokenized.arrow", "validation.arrow"):
            tok = wf.path("results", ds, name)
            if tok.exists():
                try:
                    load_tokenized(tok)
                except Exception as exc:  # any failure to open is the finding
                    bad.append(f"{ds}: {name} does not open: {type(exc).__name__}: {exc}")
        for f in exports(ds):
            if wf.path(f).exists():
                try:
                    load_jsonl(wf.path(f))
                except ValueError as exc:
                    bad.append(f"{ds}: {f} not whole: {exc}")
    return bad


def check_errors(before, now, journaled):
    """errors.jsonl: whole lines from before kept in order, each whole line a record, no id errored
    twice, none both journaled and errored."""
    bad = []
    old, new = before.get("error_lines", []), now.get("error_lines", [])
    if new[: len(old)] != old:
        bad.append(f"errors.jsonl prefix not preserved ({len(old)} whole lines before, {len(new)} now)")
    try:
        ids = keyed(new)
    except ValueError as exc:  # e.g. a record glued onto a torn one
        return bad + [f"a whole errors.jsonl line does not parse: {exc}"]
    if duplicates(ids):
        bad.append(f"ids errored twice in errors.jsonl: {duplicates(ids)[:5]}")
    if set(ids) & journaled:
        bad.append(f"ids both journaled and errored: {sorted(set(ids) & journaled)[:5]}")
    return bad


def compare_mixture(ds, g, r):
    """X's final outputs against the reference's by invariants (see MIXTURE)."""
    bad, cells = [], set(MIXTURE[ds]["mixture"])
    if set(g["raw"]) != set(r["raw"]):
        return [f"{ds}: raw ids differ: {len(set(g['raw']) ^ set(r['raw']))} ids in one only"]
    for i, rec in g["raw"].items():
        want = r["raw"][i]
        if rec["cell"] not in cells or rec["split"] != want["split"]:
            bad.append(f"{ds}: {i} in cell {rec['cell']} split {rec['split']}, the reference's split {want['split']}")
        elif rec["cell"] == want["cell"] and rec != want:
            bad.append(f"{ds}: {i}: raw content differs from the reference's in the same cell")
    for split, rows in (("train", g["tokenized"]), ("validation", g["validation"])):
        ids = {i for i, rec in g["raw"].items() if rec["split"] == split}
        if set(rows) != ids:
            bad.append(f"{ds}: {split} rows are not the {split} records ({len(set(rows) ^ ids)} ids in one only)")
        bad += [f"{ds}: row {i} of cell {row['cell']}, its record's {g['raw'][i]['cell']}"
                for i, row in rows.items() if i in g["raw"] and row["cell"] != g["raw"][i]["cell"]]
        f = exports(ds)[0 if split == "train" else 1]
        if g["exported"][f] != sorted(ids):
            bad.append(f"{ds}: {f} ids are not the {split} records'")
    return bad


def compare_final(got, ref):
    bad = []
    for ds in DATASETS:
        g, r = got[ds], ref[ds]
        if ds in MIXTURE:
            bad += compare_mixture(ds, g, r)
            continue
        if duplicates(g["raw_ids"]):
            bad.append(f"{ds}: ids twice in raw_responses.jsonl: {duplicates(g['raw_ids'])[:5]}")
        if set(g["raw"]) != set(r["raw"]):
            bad.append(f"{ds}: raw ids differ: {len(set(g['raw']) ^ set(r['raw']))} ids in one only")
        else:
            diff = [i for i in r["raw"] if g["raw"][i] != r["raw"][i]]
            if diff:
                bad.append(f"{ds}: raw content differs for {len(diff)} ids, e.g. {diff[0]}")
        if set(g["tokenized"]) != set(r["tokenized"]):
            bad.append(f"{ds}: tokenized ids differ")
        else:
            diff = [i for i in r["tokenized"] if g["tokenized"][i] != r["tokenized"][i]]
            if diff:
                bad.append(f"{ds}: tokenized rows differ for {len(diff)} ids, e.g. {diff[0]}")
        if g["meta"] != r["meta"]:
            keys = sorted(k for k in set(g["meta"]) | set(r["meta"]) if g["meta"].get(k) != r["meta"].get(k))
            bad.append(f"{ds}: tokenized.arrow provenance differs in {keys}")
        if g["exported"] != r["exported"]:
            bad.append(f"{ds}: exported ids differ from the reference's")
    return bad


# -- the soak --------------------------------------------------------------------------------------
class Soak:
    """A tokenizer, one deterministic mock server and the reference run; trials in subfolders of root."""

    def __init__(self, root, tokens_per_s=40, mean_tokens=30, concurrency=4, cores=2, log=print, settings_change=True,
                 change="regenerate", inference_share=0.0):
        """change: generation.on_settings_change of stage 2 (CHANGES: regenerate or extend). inference_share:
        the share of kill delays drawn from the reference's inference span instead of its whole span."""
        self.root = Path(root)
        self.inference_share = inference_share
        self.inference_s = None  # the reference run's last inference job's end, from its start
        self.conversation_turns = None  # {M's conversation id: its turns} of the reference run
        self.settings_change = settings_change
        self.change = CHANGES[change]
        self.root.mkdir(parents=True, exist_ok=True)
        self.cores = cores
        self.concurrency = concurrency
        self.log = log
        self.targets = [t for ds in DATASETS for t in [f"results/{ds}/tokenized.arrow", *exports(ds)]]
        from budgetgen_testkit.tiny_tokenizer import build_tokenizer

        self.tokenizer = self.root / "tokenizer"
        if not (self.tokenizer / "tokenizer.json").exists():
            build_tokenizer(self.tokenizer, [CORPUS], vocab_size=512)
        self.server_args = ["--length-dist", "lognormal", "--mean-tokens", str(mean_tokens), "--sigma", "0.5",
                            "--tokens-per-s", str(tokens_per_s), "--reasoning-share", "0.2",
                            "--fail-400", str(FAIL_400), "--error-bytes", str(ERROR_BYTES),
                            "--fault-seed", str(FAULT_SEED), *[str(x) for kv in FAULTS.items() for x in kv]]
        self.server, self.base_url = mock_server.spawn(self.server_args, self.root / "server")
        self.ref = None
        self.ref_s = None
        self.ref_new_lines = None  # whole journal lines the reference run added (stage 2)
        self.ref_errors = None  # {dataset: sorted ids in errors.jsonl} of the reference run (its identity)
        self.identities = None  # {dataset: the identity shas of the reference run's records (cells, extend)}
        self.stage1 = None  # stage 1's finished folder, copied by each trial (settings_change)

    def close(self):
        mock_server.stop(self.server)

    def config(self, stage):
        datasets = {ds: {"prompts": f"prompts/{ds}.jsonl", **MULTI_TURN.get(ds, {}), **MIXTURE.get(ds, {})}
                    for ds in DATASETS}
        cfg = base_config(self.base_url, self.tokenizer, datasets, token_budget=10**6, concurrency=self.concurrency)
        if stage == 2:
            cfg["generation"].update(self.change)
        return cfg

    def write_prompts(self, d, stage):
        """The prompts of a stage: STAGE1_SHARE of each dataset's in stage 1, all of them (the same first
        ones, then the rest) in stage 2; without a settings change, all of them."""
        for ds, n in DATASETS.items():
            if stage == 1 and self.settings_change:
                n = round(n * STAGE1_SHARE)
            if ds in MULTI_TURN:
                write_conversations(d / "prompts" / f"{ds}.jsonl", n, prefix=ds)
            else:
                write_prompts(d / "prompts" / f"{ds}.jsonl", n, prefix=ds)

    def workflow(self, name, stage=None):
        """A working folder for one run of the trials' stage: a fresh one, or (settings change) a copy of
        stage 1's finished folder with stage 2's config; stage=1 makes that first folder."""
        d = self.root / name
        if d.exists():
            shutil.rmtree(d)
        stage = stage or (2 if self.settings_change else 1)
        if stage == 2:
            shutil.copytree(self.stage1, d, symlinks=True)
            for f in d.glob("snakemake.*.out"):
                f.unlink()
        self.write_prompts(d, stage)
        return Workflow(d, self.config(stage))

    def start(self, wf, n):
        log = open(wf.path(f"snakemake.{n}.out"), "w")
        try:
            return subprocess.Popen(wf.cmd("--cores", str(self.cores), *self.targets), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def reference(self):
        """The uninterrupted run: its outputs and its duration (the span kill delays are drawn from);
        with a settings change, after stage 1 run to the end in its own folder."""
        if self.settings_change:
            first = self.workflow("stage1", stage=1)
            proc = self.start(first, 1)
            if proc.wait(timeout=600) != 0:
                raise RuntimeError(f"stage 1 failed:\n{first.path('snakemake.1.out').read_text()[-4000:]}")
            self.stage1 = first.dir
        wf = self.workflow("reference")
        t0, wall0 = time.monotonic(), time.time()
        proc = self.start(wf, 1)
        rc = proc.wait(timeout=600)
        self.ref_s = time.monotonic() - t0
        # inference ends with its done marker (every dataset's inference job runs at once)
        self.inference_s = min(self.ref_s, max(wf.path("results", ds, "inference.done").stat().st_mtime - wall0
                                               for ds in DATASETS))
        if rc != 0:
            raise RuntimeError(f"reference run failed ({rc}):\n{wf.path('snakemake.1.out').read_text()[-4000:]}")
        self.ref = final_outputs(wf)
        self.ref_new_lines = journal_lines(wf.dir) - (journal_lines(self.stage1) if self.stage1 else 0)
        self.identities = {}
        extend = self.settings_change and self.change["on_settings_change"] == "extend"
        for ds in DATASETS:
            found = {r.get("identity") for r in self.ref[ds]["raw"].values()}
            most = len(MIXTURE[ds]["mixture"]) if ds in MIXTURE else 1
            if not 1 <= len(found) <= most * (2 if extend else 1):
                raise RuntimeError(f"reference run: {ds} rows of {len(found)} identities")
            self.identities[ds] = found
        self.ref_errors = error_ids(wf, self.identities)
        self.conversation_turns = {}
        for ds in MULTI_TURN:
            for rid, rec in self.ref[ds]["raw"].items():
                conv, turn = record_place(rid, rec)
                self.conversation_turns[conv] = max(turn, self.conversation_turns.get(conv, 0))
        for ds, n in DATASETS.items():
            # a prompt errored under stage 1's identity is asked again under extend's new one (and fails again)
            errs, raw = set(self.ref_errors[ds]), self.ref[ds]["raw"]
            if ds in MULTI_TURN:  # turns and samples: at least one response per conversation's first turn
                if not raw or set(errs) & set(raw):
                    raise RuntimeError(f"reference run: {ds} has {len(raw)} responses and {len(errs)} errors")
            elif (not errs and ds not in MIXTURE) or len(raw) + len(errs) != n or set(errs) & set(raw):
                raise RuntimeError(f"reference run: {ds} has {len(raw)} responses and "
                                   f"{len(errs)} errors, not {n} prompts with at least one error")
        n_err = sum(map(len, self.ref_errors.values()))
        n_raw = sum(len(self.ref[ds]["raw"]) for ds in DATASETS)
        self.log(f"reference run: {self.ref_s:.1f} s (inference {self.inference_s:.1f} s), {n_raw} responses and "
                 f"{n_err} errors (HTTP 400) in {len(DATASETS)} datasets"
                 + (" after a settings change (stage 2)" if self.settings_change else ""))
        return self.ref

    def kill_delay(self, rng):
        """A kill's delay: from the reference's inference span with probability inference_share, else
        from its whole span."""
        hi = self.inference_s if self.inference_share and rng.random() < self.inference_share else self.ref_s
        return rng.uniform(0.0, hi)

    def progress_point(self, third, rng):
        """A first kill for the third-th of three trials, at a point of the trial's own progress: mid-
        inference (after 1 .. half of the reference's new journal lines), while a tokenize job runs
        (finalize is done for that dataset, others may still generate), while an export job runs (the tail)."""
        if third == 0:
            return ("records", rng.randint(1, max(1, self.ref_new_lines // 2)))
        return ("phase", "tokenize" if third == 1 else "export")

    def mid_conversations(self, snap):
        """Multi-turn conversations journaled in part (some of the reference's turns, not all) under an
        identity of the reference's records (regenerate's earlier records aside)."""
        turns = {}
        for ds in MULTI_TURN:
            for line in snap[ds]["lines"]:
                rec = json.loads(line)
                if rec.get("identity") not in self.identities[ds]:
                    continue
                conv, turn = record_place(rec["id"], rec)
                turns.setdefault((rec.get("identity"), conv), set()).add(turn)
        return sum(0 < len(got) < self.conversation_turns.get(conv, 0) for (_, conv), got in turns.items())

    def trial(self, seed, max_kills=3, again=0.5, first=None, run_timeout=600):
        """One trial; returns a dict with passed, kills [{at_s, phase, torn_bytes, mid_conversations}], runs,
        failures.

        first=(kind, value) puts the first kill at a point of this trial's own progress, never at a time
        taken from another run's clock (CI: on a loaded machine a run can take twice the reference's span
        or half of it): ("records", k) once the journals hold k more whole lines than at the run's start
        (mid-inference), ("phase", p) once a job of step p (PHASES: tokenize, export...) is seen running;
        progress_point draws one. Otherwise the first kill comes after kill_delay, as every later one.
        """
        if self.ref is None:
            self.reference()
        rng = random.Random(seed)
        wf = self.workflow(f"trial-{seed}")
        before = journal_snapshot(wf)
        kills, failures, runs = [], [], 0
        error_records = 0
        t_trial = time.monotonic()
        while not failures:
            if kills:  # kill -9 leaves snakemake's lock; remove it as a user would
                unlock = wf.run("--unlock", check=False)
                if unlock.returncode != 0:
                    failures.append(f"--unlock failed ({unlock.returncode}): {unlock.output[-2000:]}")
                    break
            runs += 1
            trigger = None
            if not kills:
                kill_at = self.kill_delay(rng) if first is None else None
                trigger = first
            else:
                again_draw, kill_at = rng.random(), self.kill_delay(rng)
                if len(kills) >= max_kills or again_draw >= again:
                    kill_at = None
            start_lines = journal_lines(wf.dir)
            t_run = time.monotonic()
            proc = self.start(wf, runs)
            if trigger is not None:  # the run's own progress: alive at the point, or ended before it
                reached = wait_for_progress(proc, wf, trigger, start_lines, run_timeout)
                kill, timed_out = reached and proc.poll() is None, not reached
            else:
                try:
                    proc.wait(timeout=run_timeout if kill_at is None else kill_at)
                    kill = timed_out = False
                except subprocess.TimeoutExpired:
                    kill, timed_out = kill_at is not None, kill_at is None
            if timed_out:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                failures.append(f"run {runs} did not finish within {run_timeout} s")
                break
            if kill:
                kill_at = time.monotonic() - t_run
                phase = phases_of(group_members(proc.pid))
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                left = wait_group_gone(proc.pid)
                if left:
                    failures.append(f"kill {len(kills) + 1}: processes survived kill -9 of the group: {left}")
                now = journal_snapshot(wf)
                failures += [f"kill {len(kills) + 1} ({phase}): {f}" for f in check_after_kill(wf, before, now)]
                kills.append({"at_s": round(kill_at, 2), "phase": phase, "trigger": list(trigger or ()),
                              "torn_bytes": sum(s["torn"] for s in now.values()),
                              "journal_lines": sum(len(s["lines"]) for s in now.values()),
                              "error_torn_bytes": sum(s["error_torn"] for s in now.values()),
                              "error_lines": sum(len(s["error_lines"]) for s in now.values()),
                              "mid_conversations": self.mid_conversations(now)})
                before = now
                continue
            if proc.returncode != 0:
                failures.append(f"run {runs} exited {proc.returncode}:\n"
                                f"{wf.path(f'snakemake.{runs}.out').read_text()[-3000:]}")
                break
            now = journal_snapshot(wf)
            failures += [f"final: {f}" for f in check_after_kill(wf, before, now)]
            try:
                got = final_outputs(wf)
            except Exception as exc:  # a missing or broken final output is the finding
                failures.append(f"final outputs unreadable: {type(exc).__name__}: {exc}")
                break
            failures += [f"final: {f}" for f in compare_final(got, self.ref)]
            errors = error_ids(wf, self.identities)
            for ds in DATASETS:
                ids = [i for sha, i in keyed(now[ds]["lines"]) if sha in self.identities[ds]]
                if set(ids) != set(self.ref[ds]["raw"]):
                    failures.append(f"final: {ds}: journal ids differ from the reference")
                if errors[ds] != self.ref_errors[ds] or now[ds]["error_torn"]:
                    failures.append(f"final: {ds}: errors.jsonl ids {errors[ds]} (torn tail "
                                    f"{now[ds]['error_torn']} bytes), the reference {self.ref_errors[ds]}")
            error_records = sum(len(s["error_lines"]) for s in now.values())
            break
        # temporary files of atomic writes a kill cut short (harmless; counted, not a failure)
        left = sorted(str(f.relative_to(wf.dir)) for f in wf.path("results").rglob(".*.tmp*"))
        return {"seed": seed, "passed": not failures, "kills": kills, "runs": runs, "failures": failures,
                "temp_files_left": left, "error_records": error_records,
                "wall_s": round(time.monotonic() - t_trial, 1), "dir": str(wf.dir)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="seed of the first trial; trial k uses seed+k")
    ap.add_argument("--max-kills", type=int, default=3, help="kills per trial at most")
    ap.add_argument("--again", type=float, default=0.5, help="probability of killing a rerun again")
    ap.add_argument("--tokens-per-s", type=float, default=40, help="the mock server's per-stream token rate")
    ap.add_argument("--workdir", default="/tmp/budgetgen-soak", help="trial folders (failed ones are kept)")
    ap.add_argument("--keep", action="store_true", help="keep passed trials' folders too")
    ap.add_argument("--results", default=str(HERE / "results.jsonl"), help="append the result line here")
    ap.add_argument("--no-settings-change", dest="settings_change", action="store_false",
                    help="one stage in a fresh folder, no settings change between runs")
    ap.add_argument("--change", choices=sorted(CHANGES), default="regenerate",
                    help="generation.on_settings_change of stage 2 (default %(default)s)")
    ap.add_argument("--inference-share", type=float, default=0.0,
                    help="share of kill delays drawn from the reference's inference span, not its whole span "
                         "(more kills mid-stream and mid-conversation; default %(default)s)")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    soak = Soak(a.workdir, tokens_per_s=a.tokens_per_s, settings_change=a.settings_change, change=a.change,
                inference_share=a.inference_share)
    results = []
    try:
        soak.reference()
        for k in range(a.trials):
            r = soak.trial(a.seed + k, max_kills=a.max_kills, again=a.again)
            results.append(r)
            kills = ", ".join(f"{x['at_s']:.1f}s:{x['phase']}" for x in r["kills"]) or "none"
            print(f"trial {k + 1}/{a.trials} seed {r['seed']}: {'PASS' if r['passed'] else 'FAIL'} "
                  f"({r['runs']} runs, kills: {kills}, {r['error_records']} error records, {r['wall_s']} s)",
                  flush=True)
            for f in r["failures"]:
                print(f"  {f}", flush=True)
            if r["temp_files_left"]:
                print(f"  temporary files left by killed writes: {r['temp_files_left']}", flush=True)
            if r["passed"] and not a.keep:
                shutil.rmtree(r["dir"], ignore_errors=True)
    finally:
        soak.close()
    passed = sum(r["passed"] for r in results)
    phases = Counter(x["phase"] for r in results for x in r["kills"])
    line = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "trials": len(results), "passed": passed,
            "kills": sum(len(r["kills"]) for r in results), "kills_by_phase": dict(sorted(phases.items())),
            "trials_without_kill": sum(not r["kills"] for r in results),
            "torn_tails_seen": sum(x["torn_bytes"] > 0 for r in results for x in r["kills"]),
            "error_records": sum(r["error_records"] for r in results),
            "error_records_at_kills": sum(x["error_lines"] for r in results for x in r["kills"]),
            "torn_error_tails_seen": sum(x["error_torn_bytes"] > 0 for r in results for x in r["kills"]),
            "kills_mid_conversation": sum(x["mid_conversations"] > 0 and "inference" in x["phase"]
                                          for r in results for x in r["kills"]),
            "inference_share": a.inference_share, "reference_inference_s": round(soak.inference_s or 0, 1),
            "fail_400": FAIL_400, "faults": FAULTS, "datasets": DATASETS, "multi_turn": MULTI_TURN,
            "mixture": MIXTURE, "settings_change": CHANGES[a.change] if a.settings_change else None,
            "stage1_share": round(STAGE1_SHARE, 3) if a.settings_change else None,
            "temp_files_left": sum(len(r["temp_files_left"]) for r in results),
            "reference_run_s": round(soak.ref_s or 0, 1), "tokens_per_s": a.tokens_per_s, "seed": a.seed,
            "max_kills": a.max_kills, "failed_seeds": [r["seed"] for r in results if not r["passed"]],
            "wall_s": round(time.monotonic() - t0, 1)}
    print(f"trials passed/run: {passed}/{len(results)}")
    print(json.dumps(line))
    with open(a.results, "a") as f:
        f.write(json.dumps(line) + "\n")
    return 0 if passed == len(results) == a.trials else 1


if __name__ == "__main__":
    sys.exit(main())
