from budgetgen.stream_workers import AUTO_STREAMS, stream_processes


def test_auto_streams_in_the_job_below_the_threshold_and_one_worker_per_threshold_above():
    assert stream_processes("auto", 150, 64) == 0  # the job's own process keeps up
    assert stream_processes("auto", AUTO_STREAMS - 1, 64) == 0
    assert stream_processes("auto", AUTO_STREAMS, 64) == 1
    assert stream_processes("auto", 4 * AUTO_STREAMS + 1, 64) == 5
    assert stream_processes("auto", 100 * AUTO_STREAMS, 8) == 7  # at most the cores less the job's own
    assert stream_processes("auto", 4 * AUTO_STREAMS, 1) == 0  # one core: nothing to spread over


def test_a_number_is_taken_as_given():
    assert stream_processes(0, 10_000, 64) == 0
    assert stream_processes(3, 10, 2) == 3
