"""`snakemake --report report.html` after a real run against the mock server, and the report opened
in headless Chromium (Debian's `chromium`): a screenshot of its landing page and one of a plot opened
the way a user does (two clicks, scripted), each checked to show what it should."""

import base64
import json
import re
import shutil
import subprocess

import pytest

from budgetgen import plots
from budgetgen_testkit import mock_server
from budgetgen_testkit.tiny_tokenizer import build_tokenizer
from support import CORPUS
from support.workflow import Workflow, base_config, write_prompts

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000",
                  "--virtual-time-budget=8000"]
DATASETS = ("A", "B")

# Appended to a copy of the report: click the dataset in the navbar, then the eye button of one
# figure's row (what a user does), then record what the page shows and whether every embedded image
# decodes, in a hidden element that --dump-dom prints.
DRIVER = """
<script>
(function () {
  const want = %s;
  const found = {category: false, row: false};
  const byText = (sel, text) => Array.from(document.querySelectorAll(sel)).find(el => el.textContent.trim() === text);
  function report(decoded) {
    const img = Array.from(document.querySelectorAll("#app img")).find(im => im.getAttribute("src") === \
results[want.path].data_uri);
    const out = document.createElement("pre");
    out.id = "budgetgen-check";
    out.style.display = "none";
    out.textContent = JSON.stringify({...found, shown: Boolean(img), shownWidth: img ? img.naturalWidth : 0,
                                      decoded: decoded});
    document.body.appendChild(out);
  }
  function decodeAll() {
    const paths = Object.keys(results).filter(p => results[p].mime_type.startsWith("image/"));
    Promise.all(paths.map(p => new Promise(done => {
      const im = new Image();
      im.onload = () => done([p, im.naturalWidth, im.naturalHeight]);
      im.onerror = () => done([p, 0, 0]);
      im.src = results[p].data_uri;
    }))).then(sizes => report(Object.fromEntries(sizes.map(([p, w, h]) => [p, [w, h]]))));
  }
  window.addEventListener("load", () => setTimeout(() => {
    const link = byText("#app a", want.category);
    if (link) { found.category = true; link.click(); }
    setTimeout(() => {
      const cell = byText("#app td", want.label);
      const button = cell && cell.parentElement.querySelector("a");
      if (button) { found.row = true; button.click(); }
      setTimeout(decodeAll, 300);
    }, 300);
  }, 300));
})();
</script>
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A run of `all` on two datasets (A met, with reasoning and retried 500s; B exhausted, with two
    prompts refused by the context limit), then `snakemake --report`."""
    root = tmp_path_factory.mktemp("report")
    tokenizer = root / "tokenizer"
    build_tokenizer(tokenizer, [CORPUS], vocab_size=512)
    (root / "server").mkdir()
    proc, base_url = mock_server.spawn(["--length-dist", "lognormal", "--mean-tokens", "50", "--reasoning-share",
                                        "0.3", "--tokens-per-s", "400", "--context-limit", "300", "--fail-500",
                                        "0.05", "--fault-seed", "3"], root / "server")
    try:
        work = root / "work"
        write_prompts(work / "prompts" / "A.jsonl", 150, prefix="A")
        write_prompts(work / "prompts" / "B.jsonl", 10, prefix="B")
        with open(work / "prompts" / "B.jsonl", "a") as f:
            for i in range(2):
                f.write(json.dumps({"prompt": "long " * 200 + str(i)}) + "\n")
        wf = Workflow(work, base_config(base_url, tokenizer, {
            "A": {"prompts": "prompts/A.jsonl", "token_budget": 2500},
            "B": {"prompts": "prompts/B.jsonl", "token_budget": 10**6}}))
        wf.run("--cores", "2", "all")
        html = root / "report.html"
        out = wf.run("--report", str(html)).output
    finally:
        mock_server.stop(proc)
    assert "Report created." in out
    return root, wf, html


def embedded(html_text, name):
    m = re.search(rf'<script id="{name}">\s*var \w+ = (.*?);\s*</script>', html_text, re.S)
    assert m, f"no {name} in the report"
    return json.loads(m.group(1))


def decode_data_uri(uri):
    head, data = uri.split(",", 1)
    return base64.b64decode(data).decode() if head.endswith(";base64") else data


def test_report_embeds_every_figure_with_its_caption_and_the_summary(report):
    _, wf, html = report
    text = html.read_text()
    results, categories = embedded(text, "results"), embedded(text, "categories")
    assert set(categories) == {*DATASETS, "Summary"}
    for ds in DATASETS:
        want = {f"results/{ds}/plots/{name}.svg" for name in plots.FIGURES}
        assert set(categories[ds]["Other"]) == want
        for path in want:
            entry = results[path]
            assert entry["mime_type"] == "image/svg+xml" and entry["caption"]
            svg = decode_data_uri(entry["data_uri"])
            assert svg.startswith("<?xml") and "</svg>" in svg and f"{ds}: " in svg
            assert svg == wf.path(path).read_text()  # the figure the rule drew, whole
    assert "estimated" in results["results/A/plots/reasoning.svg"]["caption"]
    assert "created + latency_s" in results["results/A/plots/throughput.svg"]["caption"]
    summary = results["results/summary.tsv"]
    assert summary["mime_type"] == "text/tab-separated-values" and "state" in summary["caption"]
    assert decode_data_uri(summary["data_uri"]) == wf.path("results", "summary.tsv").read_text()
    assert "budgetgen" in embedded(text, "workflow-desc") and "mock-model" in embedded(text, "workflow-desc")


def chromium(tmp_path, url, *mode):
    profile = tmp_path / "chromium-profile"
    proc = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *mode, url],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def pixels(png):
    from PIL import Image

    with Image.open(png) as im:
        rgb = im.convert("RGB")
        raw = rgb.tobytes()
        return rgb.size, list(zip(raw[0::3], raw[1::3], raw[2::3]))


def variance(values):
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def hex_rgb(color):
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_report_renders_its_plots_in_headless_chromium(report, capsys):
    root, _, html = report
    landing, plot = root / "report-landing.png", root / "report-plot-A-lengths.png"
    chromium(root, html.as_uri(), f"--screenshot={landing}")

    driven = root / "report-driven.html"
    path = "results/A/plots/lengths.svg"
    script = DRIVER % json.dumps({"category": "A", "label": "2 completion lengths", "path": path})
    head, tail = html.read_text().rsplit("</body>", 1)  # the last one: scripts above embed the string too
    driven.write_text(head + script + "</body>" + tail)
    chromium(root, driven.as_uri(), f"--screenshot={plot}")
    dom = chromium(root, driven.as_uri(), "--dump-dom").stdout
    with capsys.disabled():
        print(f"\nreport screenshots: {landing} {plot}")

    m = re.search(r'<pre id="budgetgen-check"[^>]*>(.*?)</pre>', dom, re.S)
    assert m, "the driver script left no result: the report's app did not load"
    check = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert check["category"] and check["row"], check  # the navbar and the results table were there to click
    assert check["shown"] and check["shownWidth"] > 0  # the clicked figure is the one on screen, decoded
    images = [p for p in check["decoded"] if p.endswith(".svg")]
    assert len(images) == len(DATASETS) * len(plots.FIGURES)
    assert all(w > 0 and h > 0 for w, h in check["decoded"].values()), check["decoded"]

    (width, height), landing_px = pixels(landing)
    assert (width, height) == (1400, 1000)
    assert variance([sum(p) for p in landing_px]) > 100  # not a blank page
    _, plot_px = pixels(plot)
    assert variance([sum(p) for p in plot_px]) > 100
    # the histogram's bars, in the figure's own colour, cover a real area of the screenshot (and
    # none of the landing page, so it is the plot that put them there)
    bar = hex_rgb(plots.COLOR_TOKENS)
    near = lambda px: sum(1 for p in px if all(abs(a - b) <= 8 for a, b in zip(p, bar)))  # noqa: E731
    assert near(plot_px) > 5000 and near(landing_px) < 100
