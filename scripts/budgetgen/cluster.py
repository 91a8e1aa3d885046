"""What an inference job asks a cluster for, decided by the server mode; the profile checks.

- inference_resources(config): the rule's own resources. An inference job that only talks to an
  existing server (server.base_url) is an HTTP client: one CPU (1 + N with server.client_processes N,
  its stream workers'; auto asks one, so the job, which counts the CPUs it is allotted, reads its
  streams itself), server.client_mem_mb, no GPU, on the profile's default (CPU) partition. One that
  launches its server (server.launch) asks for what that server needs: GPUs = its tensor-parallel x
  pipeline-parallel x data-parallel size read from the launch template (or server.launch_resources.gpus
  / .gres), server.launch_resources.cpus_per_task and .mem_mb, on server.launch_resources.slurm_partition
  (else the profile's default partition).
- profile_problem(config, default_resources, set_resources): one line, before anything is submitted
  (and on `snakemake -n`), for a placeholder account (profiles/slurm ships `CHANGE_ME`), or a profile
  that asks GPUs for an inference job that launches no server (the profile's set-resources win over
  the rule's own, so a GPU there would be held by an HTTP client for the whole run).
- request_line(config, default_resources, set_resources): what each inference job will ask the
  cluster for, as the status table prints it.
- loopback_warning(config): one line when inference jobs run on other machines (a cluster executor)
  but server.base_url names this host's loopback (127.0.0.0/8, ::1, localhost), which a compute node
  cannot reach; None with server.launch (the job starts its server beside itself) or a routable host.
- LOCAL_STEPS: the steps that run on the submitting host under a cluster executor (`localrule: True` in
  their rules): seconds of work each, not worth a job and its queue wait.

`default_resources` and `set_resources` are Snakemake's parsed profile values
(workflow.resource_settings: {name: Resource} and {rule: {name: Resource}}) or plain dicts; a
Resource's profile text is its `.raw` (`"'cpu'"`, `1440 * attempt`).
"""

from __future__ import annotations

import ipaddress
import shlex
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

PLACEHOLDER_ACCOUNTS = ("CHANGE_ME",)
_PARALLEL_FLAGS = (
    ("--tp", "--tp-size", "--tensor-parallel-size", "-tp"),
    ("--pp", "--pp-size", "--pipeline-parallel-size", "-pp"),
    ("--dp", "--dp-size", "--data-parallel-size", "-dp"),
)
_GPU_KEYS = ("gres", "gpu", "gpus", "gpus_per_task", "gpus_per_node")
# the rules with `localrule: True` (held against the rules by tests/unit/test_conventions.py)
LOCAL_STEPS = ("budget_status", "finalize", "summary", "plots")


def launch_gpus(template: str | None) -> int:
    """GPUs a launched server uses: the product of its tensor-, pipeline- and data-parallel sizes in the
    launch template (SGLang's and vLLM's flag names, `--flag N` or `--flag=N`), 1 for each not given."""
    try:
        words = shlex.split(template or "")
    except ValueError:
        words = (template or "").split()
    sizes = {}
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if not eq and i + 1 < len(words):
            value = words[i + 1]
        for group, names in enumerate(_PARALLEL_FLAGS):
            if flag in names and value.isdigit():
                sizes[group] = int(value)
    total = 1
    for n in sizes.values():
        total *= max(1, n)
    return total


def inference_resources(config: dict[str, Any]) -> dict[str, int | str]:
    """The inference rule's resources (besides server_slots), from the server mode."""
    server = config["server"]
    if not server.get("launch"):
        workers = server["client_processes"]
        return {"cpus_per_task": 1 + (0 if workers == "auto" else int(workers)), "mem_mb": int(server["client_mem_mb"])}
    own = server["launch_resources"]
    out = {"cpus_per_task": int(own["cpus_per_task"]), "mem_mb": int(own["mem_mb"]),
           "gres": own.get("gres") or f"gpu:{int(own.get('gpus') or launch_gpus(server['launch']))}"}
    if own.get("slurm_partition"):
        out["slurm_partition"] = own["slurm_partition"]
    return out


def profile_value(resource: object) -> str:
    """A profile resource's text without the quotes of a Python string literal (`'cpu'` -> cpu), or the
    expression (`1440 * attempt`); a plain value as it is."""
    raw = getattr(resource, "raw", resource)
    if raw is None and hasattr(resource, "_value"):
        raw = resource._value
    text = str(raw)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text


def profile_problem(config: dict[str, Any], default_resources: Mapping[str, object] | None,
                    set_resources: Mapping[str, Mapping[str, object]] | None) -> str | None:
    """One line naming the profile key, or None."""
    defaults = dict(default_resources or {})
    inference = dict((set_resources or {}).get("inference") or {})
    for where, res in (("default-resources", defaults), ("set-resources.inference", inference)):
        if "slurm_account" in res and profile_value(res["slurm_account"]) in PLACEHOLDER_ACCOUNTS:
            return (f"profile key {where}.slurm_account is the placeholder {profile_value(res['slurm_account'])}: "
                    "set your SLURM account (sacctmgr show assoc user=$USER format=account) or delete the line "
                    "if your cluster has none; nothing was submitted")
    if not config["server"].get("launch"):
        asked = [k for k in _GPU_KEYS if k in inference and profile_value(inference[k]) not in ("", "0", "None")]
        if asked:
            return (f"profile key set-resources.inference.{asked[0]} asks the cluster for GPUs "
                    f"({profile_value(inference[asked[0]])}), but server.launch is not set: each inference job is "
                    "an HTTP client of server.base_url and would hold them idle for the whole run; delete it (the "
                    "workflow asks for a launched server's GPUs itself: server.launch_resources)")
    return None


def request_line(config: dict[str, Any], default_resources: Mapping[str, object] | None,
                 set_resources: Mapping[str, Mapping[str, object]] | None) -> str:
    """`inference jobs ask for: ...`: the rule's resources under the profile's (set-resources win over the
    rule's, the rule's over default-resources), with the server mode that decided them."""
    own = inference_resources(config)
    effective = {k: profile_value(v) for k, v in dict(default_resources or {}).items()}
    effective.update({k: str(v) for k, v in own.items()})
    effective.update({k: profile_value(v) for k, v in dict((set_resources or {}).get("inference") or {}).items()})
    gpus = next((f"{k} {effective[k]}" for k in _GPU_KEYS if effective.get(k) not in (None, "", "0", "None")),
                "no GPU")
    parts = [f"{effective.get('cpus_per_task', '1')} CPU", f"{effective.get('mem_mb', '?')} MB", gpus]
    for key in ("slurm_partition", "runtime", "slurm_account"):
        if effective.get(key) not in (None, "", "None"):
            parts.append(f"{key.removeprefix('slurm_')} {effective[key]}")
    server = config["server"]
    if server.get("launch"):
        why = f"each launches its server (server.launch; {launch_gpus(server['launch'])} GPU by its parallel sizes)"
    else:
        urls = server.get("base_url")
        why = "each is an HTTP client of " + (urls if isinstance(urls, str) else ", ".join(urls))
    return f"inference jobs ask the cluster for: {', '.join(parts)} ({why})"


def _is_loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_warning(config: dict[str, Any]) -> str | None:
    """For a run whose inference jobs go to a cluster executor: one line when server.base_url is this
    host's loopback, which the compute nodes running those jobs cannot reach."""
    server = config["server"]
    if server.get("launch"):
        return None
    urls = server.get("base_url")
    urls = [urls] if isinstance(urls, str) else list(urls or ())
    local = [u for u in urls if _is_loopback(u)]
    if not local:
        return None
    return (f"warning: server.base_url {', '.join(local)} is this host's loopback, but inference jobs run on "
            "the cluster's compute nodes, which cannot reach it: give the server's hostname or address "
            "(or use server.launch to start the server inside the job)")
