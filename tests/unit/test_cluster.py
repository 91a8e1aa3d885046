"""budgetgen.cluster: what an inference job asks a cluster for follows the server mode; the profile
checks (a placeholder account, GPUs asked for an HTTP client) refuse in one line."""

import pytest
from snakemake.resources import Resource

from budgetgen import cluster


def config(launch=None, client_processes="auto", **launch_resources):
    server = {"model": "m", "client_mem_mb": 4000, "client_processes": client_processes,
              "launch_resources": {"gpus": None, "gres": None, "cpus_per_task": 16, "mem_mb": 256000,
                                   "slurm_partition": None, **launch_resources}}
    if launch:
        server["launch"] = launch
    else:
        server["base_url"] = "http://10.0.0.5:30000/v1"
    return {"server": server}


@pytest.mark.parametrize("template, gpus", [
    ("python -m sglang.launch_server --model-path {model_path} --port {port}", 1),
    ("python -m sglang.launch_server --tp 8 --port {port}", 8),
    ("python -m sglang.launch_server --tp-size=4 --dp-size 2", 8),
    ("vllm serve {model_path} --tensor-parallel-size 4 --pipeline-parallel-size 2", 8),
    ("vllm serve {model_path} -tp 2 --data-parallel-size=2", 4),
])
def test_launch_gpus_is_the_product_of_the_parallel_sizes(template, gpus):
    assert cluster.launch_gpus(template) == gpus


def test_an_http_client_asks_for_one_cpu_and_no_gpu():
    assert cluster.inference_resources(config()) == {"cpus_per_task": 1, "mem_mb": 4000}


def test_an_http_client_with_stream_workers_asks_a_cpu_for_each():
    assert cluster.inference_resources(config(client_processes=3)) == {"cpus_per_task": 4, "mem_mb": 4000}
    # 0: the streams read in the job, its one CPU (auto, which counts the CPUs it is allotted, asks one too: above)
    assert cluster.inference_resources(config(client_processes=0))["cpus_per_task"] == 1


def test_a_launched_server_asks_for_its_gpus_cpus_memory_and_partition():
    got = cluster.inference_resources(config("vllm serve x --tensor-parallel-size 4", slurm_partition="gpu"))
    assert got == {"cpus_per_task": 16, "mem_mb": 256000, "gres": "gpu:4", "slurm_partition": "gpu"}
    assert cluster.inference_resources(config("sglang --tp 8", gres="gpu:h100:8"))["gres"] == "gpu:h100:8"
    assert cluster.inference_resources(config("sglang --tp 8", gpus=2))["gres"] == "gpu:2"


def test_a_placeholder_account_is_refused_naming_the_key():
    defaults = {"slurm_account": Resource("slurm_account", "CHANGE_ME", raw="'CHANGE_ME'")}
    problem = cluster.profile_problem(config(), defaults, {})
    assert problem.startswith("profile key default-resources.slurm_account is the placeholder CHANGE_ME")
    assert cluster.profile_problem(config(), {"slurm_account": "'my-lab'"}, {}) is None
    problem = cluster.profile_problem(config(), {}, {"inference": {"slurm_account": "CHANGE_ME"}})
    assert "set-resources.inference.slurm_account" in problem


def test_gpus_asked_for_an_http_client_are_refused_but_not_for_a_launched_server():
    profile = {"inference": {"gres": "'gpu:8'"}}
    problem = cluster.profile_problem(config(), {}, profile)
    assert problem.startswith("profile key set-resources.inference.gres asks the cluster for GPUs (gpu:8)")
    assert cluster.profile_problem(config("sglang --tp 8"), {}, profile) is None


def test_the_request_line_applies_the_profile_over_the_rule():
    defaults = {"slurm_partition": "'cpu'", "mem_mb": 1000, "runtime": 60}
    overrides = {"inference": {"runtime": Resource("runtime", 1440, raw="1440 * attempt")}}
    line = cluster.request_line(config(), defaults, overrides)
    assert line == ("inference jobs ask the cluster for: 1 CPU, 4000 MB, no GPU, partition cpu, runtime 1440 * "
                    "attempt (each is an HTTP client of http://10.0.0.5:30000/v1)")
    line = cluster.request_line(config("sglang --tp 8", slurm_partition="h100"), defaults, {})
    assert "16 CPU, 256000 MB, gres gpu:8, partition h100" in line and "8 GPU by its parallel sizes" in line


@pytest.mark.parametrize("url, warned", [
    ("http://127.0.0.1:30000/v1", True), ("http://localhost:8000/v1", True), ("http://[::1]:8000/v1", True),
    ("http://127.0.1.1:8000/v1", True), ("http://gpu-node-07:30000/v1", False), ("http://10.0.0.5:8000/v1", False),
])
def test_a_loopback_base_url_is_warned_for_cluster_jobs(url, warned):
    line = cluster.loopback_warning({"server": {"base_url": [url, "http://gpu-node-01:30000/v1"]}})
    assert (line is not None) == warned
    if warned:
        assert line.startswith("warning: server.base_url ") and url in line and "gpu-node-01" not in line
        assert "\n" not in line
    assert cluster.loopback_warning({"server": {"base_url": url, "launch": "vllm serve {model} --port {port}"}}) is None
