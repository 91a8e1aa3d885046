"""The degenerate-output facts (budgetgen.degenerate, issue 42): false positives on natural text, detection
of the garbage a broken server sends, and the CPU each response costs.

    python bench/bench_quality.py [--quick] [--sweep]

Natural text (what must pass): real text shipped by installed packages, cut into responses of
lognormal lengths (median ~2,000 characters, 60 to 24,000): every installed package's METADATA (READMEs
with markdown lists, tables, code blocks, changelogs: the repetitive kinds of a real answer), Python's
own documentation (pydoc_data.topics: prose with code) and STDLIB_FILES of its modules' source (code);
and the mock server's natural responses (the demo's), counted apart. Garbage (what must be caught):
the mock server's --garbage loop / mojibake / template_leak responses (Plan.garble, at several lengths
and max_tokens), and loops made of real text: a natural prefix, then one real phrase of 1 to 60 words
repeated to max_tokens (4 characters a token), the loop at least LOOP_CHARS long and LOOP_PERIODS
phrases (a block repeated twice is an answer; a loop runs on).

Reported per fact: false positives (share of natural responses flagged; goal <= 0.1 %), detection
(share of garbage flagged; goal >= 99 %), and the CPU per response of quality.observe against the
client's own CPU per response at ingest (bench/results/ingest-events.md: 15.2 us per token at 8 tokens
per event). --sweep prints the repetition thresholds' grid the defaults were chosen from.
"""

import argparse
import glob
import json
import math
import os
import random
import sys
import time

from common import REPO, RESULTS

sys.path.insert(0, str(REPO / "scripts"))

from budgetgen import degenerate  # noqa: E402
from budgetgen.quality import REPETITION, REPLACEMENT, TEMPLATE_LEAK, observe  # noqa: E402
from budgetgen.turn_format import special_tokens  # noqa: E402
from budgetgen_testkit import mock_server  # noqa: E402

INGEST_US_PER_TOKEN = 15.2  # bench/results/ingest-events.md, 512 streams, 8 tokens per event
CHARS_PER_TOKEN = 4.0
STDLIB_FILES = 400  # Python's own modules (any folder of the standard library): code, as answers hold it
LOOP_CHARS = 1200  # a loop runs at least this far (~300 tokens) before max_tokens ends it
LOOP_PERIODS = 4  # and at least this many times its phrase (a block repeated twice is an answer, not a loop)


def natural_documents():
    """(source, text) of the real text installed packages ship."""
    docs = []
    for path in sorted(glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "*.dist-info",
                                              "METADATA"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        body = text.split("\n\n", 1)[1] if "\n\n" in text else ""  # the long description, after the headers
        if len(body) > 200:
            docs.append(("METADATA", body))
    import pydoc_data.topics

    docs += [("pydoc", t) for t in pydoc_data.topics.topics.values() if len(t) > 200]
    stdlib = sorted(p for p in glob.glob(os.path.join(os.path.dirname(os.__file__), "**", "*.py"), recursive=True)
                    if "site-packages" not in p)
    for path in random.Random(7).sample(stdlib, min(STDLIB_FILES, len(stdlib))):
        with open(path, encoding="utf-8", errors="replace") as f:
            docs.append(("stdlib code", f.read()))
    for path in sorted(glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "**", "*.md"),
                                 recursive=True)):
        with open(path, encoding="utf-8", errors="replace") as f:
            docs.append(("package docs (.md)", f.read()))
    return docs


def cut_responses(docs, rng):
    """Each document cut into consecutive responses of lognormal lengths."""
    out = []
    for source, text in docs:
        i = 0
        while i < len(text) - 60:
            n = int(min(24000, max(60, rng.lognormvariate(math.log(2000), 1.0))))
            out.append((source, text[i:i + n]))
            i += n
    return out


def mock_plan(seed, mean, max_tokens, kind=None):
    """A response of the mock server as its command line makes one (lognormal lengths, sigma 0.8)."""
    cfg = mock_server.parse_args(["--seed", str(seed), "--length-dist", "lognormal", "--mean-tokens", str(mean)])
    plan = mock_server.Plan(cfg, [{"role": "user", "content": f"q{seed}"}], max_tokens)
    if kind:
        plan.garble(kind, max_tokens)
    return plan


def mock_responses(n, rng, kind=None):
    out = []
    for i in range(n):
        mean, max_tokens = rng.choice((20, 64, 300, 1000)), rng.choice((256, 1024, 4096))
        plan = mock_plan(i, mean, max_tokens, kind)
        out.append((plan.texts()[1], plan.finish_reason))
    return out


def real_loops(responses, n, rng):
    """A natural prefix, then one real phrase (1 to 60 words) repeated to max_tokens."""
    out = []
    for _ in range(n):
        text = rng.choice(responses)[1]
        words = text.split() or ["the"]
        k = rng.randint(1, min(60, len(words)))
        start = rng.randrange(max(1, len(words) - k + 1))
        phrase = " ".join(words[start:start + k]) + " "
        limit = int(rng.choice((1024, 2048, 4096, 8192)) * CHARS_PER_TOKEN)
        loop = max(LOOP_CHARS, LOOP_PERIODS * len(phrase))  # the least a loop runs
        prefix = text[:rng.randint(0, max(0, min(len(text), limit - loop)))]
        body = prefix + phrase * (int((limit - len(prefix)) / len(phrase)) + 1)
        out.append((body[:max(limit, len(prefix) + 3 * len(phrase))], k))
    return out


def rates(texts, fact, specials):
    flagged = sum(fact in observe(t, None, f, specials=specials) for t, f in texts)
    return flagged, len(texts)


def cpu_per_response(texts, specials, reps):
    t0 = time.process_time()
    for _ in range(reps):
        for t, f in texts:
            observe(t, None, f, specials=specials)
    us = (time.process_time() - t0) / (reps * len(texts)) * 1e6
    chars = sum(len(t) for t, _ in texts) / len(texts)
    return us, chars


def sweep(natural, loops):
    """The repetition thresholds' grid: false positives and detection by (zlib ratio, distinct share)."""
    def metrics(text):  # every tail's (zlib ratio, distinct share), as looping() judges them
        out = []
        for n in degenerate.TAILS:
            m = degenerate.loop_metrics(text[-n:], shortcut=False)
            if m is not None:
                out.append(m)
            if len(text) <= n:
                break
        return out

    def hit(ms, z, d):
        return any(a < z and b < d for a, b in ms)

    nat = [metrics(t) for t, _ in natural]
    lp = [metrics(t) for t, _ in loops]
    lines = ["| zlib ratio < | distinct share < | false positives (all natural) | detection (real text looped) |",
             "|---|---|---|---|"]
    for z in (0.15, 0.2, 0.25, 0.3):
        for d in (0.2, 0.3, 0.4, 0.5):
            fp = sum(hit(m, z, d) for m in nat) / len(natural)
            det = sum(hit(m, z, d) for m in lp) / len(loops)
            lines.append(f"| {z} | {d} | {fp:.4%} | {det:.2%} |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer garbage samples and CPU repetitions")
    ap.add_argument("--sweep", action="store_true", help="print the repetition thresholds' grid too")
    ap.add_argument("--output", default=str(RESULTS / "quality.md"))
    args = ap.parse_args(argv)
    rng = random.Random(42)
    n_garbage = 300 if args.quick else 3000
    specials = special_tokens(str(REPO / "demo" / "tokenizer"))

    real = cut_responses(natural_documents(), rng)
    mock_natural = mock_responses(n_garbage, rng)
    natural = [(t, "stop") for _, t in real] + mock_natural
    loops = [(t, "length") for t, _ in real_loops(real, n_garbage, rng)]
    garbage = {kind: mock_responses(n_garbage, rng, kind) for kind in ("loop", "mojibake", "template_leak")}

    rows = []
    for fact, bad in ((REPETITION, {"mock --garbage loop": garbage["loop"], "real text looped": loops}),
                      (REPLACEMENT, {"mock --garbage mojibake": garbage["mojibake"]}),
                      (TEMPLATE_LEAK, {"mock --garbage template_leak": garbage["template_leak"]})):
        fp, total = rates(natural[:len(real)], fact, specials)
        fp_mock, n_mock = rates(mock_natural, fact, specials)
        for name, texts in bad.items():
            hit, n = rates(texts, fact, specials)
            rows.append((fact, fp, total, fp_mock, n_mock, name, hit, n))
    us, chars = cpu_per_response(natural[:2000], specials, 1 if args.quick else 5)
    ingest_us = INGEST_US_PER_TOKEN * chars / CHARS_PER_TOKEN

    sources = {}
    for s, _ in real:
        sources[s] = sources.get(s, 0) + 1
    out = [f"# Degenerate-output facts (bench_quality.py{' --quick' if args.quick else ''})", "",
           f"Natural responses: {len(natural):,} ({', '.join(f'{v:,} {k}' for k, v in sources.items())}, "
           f"{len(natural) - len(real):,} mock responses); thresholds: tails {degenerate.TAILS} chars, "
           f"at least {degenerate.MIN_CHARS}, zlib ratio < {degenerate.ZLIB_RATIO}, distinct share < "
           f"{degenerate.DISTINCT_SHARE}.", "",
           "| fact | false positives: real text | mock responses | goal | garbage | detected | goal |",
           "|---|---|---|---|---|---|---|"]
    for fact, fp, total, fp_mock, n_mock, name, hit, n in rows:
        fp_all = (fp + fp_mock) / (total + n_mock)
        out.append(f"| {fact} | {fp} of {total:,} = {fp / total:.3%} | {fp_mock} of {n_mock:,} | <= 0.1 % "
                   f"{'met' if fp_all <= 0.001 else 'MISSED'} ({fp_all:.3%} of all) | {name} | {hit} of {n:,} = "
                   f"{hit / n:.2%} | >= 99 % {'met' if hit / n >= 0.99 else 'MISSED'} |")
    out += ["", f"CPU: quality.observe {us:.1f} us per natural response (mean {chars:,.0f} chars), against about "
            f"{ingest_us:,.0f} us of the client's own CPU to ingest it ({INGEST_US_PER_TOKEN} us/token, "
            f"{CHARS_PER_TOKEN:g} chars/token): {us / ingest_us:.1%} more."]
    if args.sweep:
        out += ["", "Repetition thresholds (the defaults' choice):", ""] + sweep(natural, loops)
    text = "\n".join(out) + "\n"
    print(text)
    with open(args.output, "w") as f:
        f.write(text)
    missed = [r for r in rows if (r[1] + r[3]) / (r[2] + r[4]) > 0.001 or r[6] / r[7] < 0.99]
    json.dump({"missed": len(missed)}, sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
