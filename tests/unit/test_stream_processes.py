import subprocess
import sys

from budgetgen.processes import AUTO_CORES, AUTO_STREAMS, stream_processes
from support import REPO


def test_auto_streams_in_the_job_below_two_workers_worth_and_one_worker_per_threshold_above():
    assert stream_processes("auto", 150, 64) == 0  # the job's own process keeps up
    assert stream_processes("auto", 2 * AUTO_STREAMS - 1, 64) == 0  # one worker would only move the work
    assert stream_processes("auto", 2 * AUTO_STREAMS, 64) == 2
    assert stream_processes("auto", 4 * AUTO_STREAMS + 1, 64) == 5
    assert stream_processes("auto", 100 * AUTO_STREAMS, 8) == 4  # at most half the cores


def test_auto_starts_no_worker_on_a_small_machine():
    assert stream_processes("auto", 4 * AUTO_STREAMS, 2) == 0
    assert stream_processes("auto", 4 * AUTO_STREAMS, AUTO_CORES - 1) == 0
    assert stream_processes("auto", 4 * AUTO_STREAMS, AUTO_CORES) == 2


def test_a_number_is_taken_as_given():
    assert stream_processes(0, 10_000, 64) == 0
    assert stream_processes(3, 10, 2) == 3


def test_building_the_settings_imports_no_http_client():
    # every `snakemake -n` builds them: the workers' count is decided apart from their transport
    code = "import sys, budgetgen.settings; print(sorted(m for m in ('httpx', 'httpcore') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO / "scripts", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
