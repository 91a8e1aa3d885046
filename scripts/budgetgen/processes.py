"""How many processes a job runs: the CPUs it may use, and its stream workers (server.client_processes).

- usable_cpus(): the CPUs this process may run on (its affinity: a SLURM job's allocation, a taskset's,
  not the whole node's as os.cpu_count() says).
- stream_processes(setting, concurrency, cpus): the stream workers (budgetgen.stream_workers) of an
  inference job. Decided here, apart from the workers' transport, so building the settings (every
  `snakemake -n`) imports no HTTP client.
"""

from __future__ import annotations

import os

AUTO_STREAMS = 512  # server.client_processes auto: one worker per this many requests in flight ...
AUTO_CORES = 4  # ... from 2 * AUTO_STREAMS on, on a machine of at least this many cores, at most half of them


def usable_cpus() -> int:
    """The CPUs this process may run on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def stream_processes(setting: int | str, concurrency: int, cpus: int) -> int:
    """The stream workers of a job (server.client_processes): the number given; auto: none below
    2 * AUTO_STREAMS in flight or with fewer than AUTO_CORES usable cores, else one per AUTO_STREAMS
    (so at least 2), at most half the cores. Measured on 2 cores with the mock server on them
    (bench/results/ingest.md): one worker is slower than none (the parsing moves, it is not shared:
    -7 % tokens/s at 512 streams, -11 % at 1,024); two beat none at 1,024 streams (+12 % tokens/s, at
    20 % more CPU per token), so a small machine, where those cores are the server's or the other
    datasets' jobs', keeps its streams in the job."""
    if setting != "auto":
        return int(setting)
    if concurrency < 2 * AUTO_STREAMS or cpus < AUTO_CORES:
        return 0
    return min(-(-concurrency // AUTO_STREAMS), cpus // 2)
