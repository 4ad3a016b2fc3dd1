"""somnus.procs: what the bench reads about a process from /proc."""

import os

from somnus import procs


def test_peak_rss_is_read_in_mib_and_covers_what_the_process_touched():
    before = procs.peak_rss_mb(os.getpid())
    block = bytearray(64 << 20)  # 64 MiB, touched
    for i in range(0, len(block), 4096):
        block[i] = 1
    after = procs.peak_rss_mb(os.getpid())
    # (the peak may be higher already from earlier tests in this process: it never goes down)
    assert before is not None and after is not None and after >= max(before, 64)
    assert procs.peak_rss_mb(2**22 + 12345) is None  # no such process
