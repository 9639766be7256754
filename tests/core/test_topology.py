"""Rank coordinates and level ranges (pure math) and the launcher's timeout."""

from __future__ import annotations

import subprocess
import time

from zerotune.core.topology import coords_rank, range_index, range_ranks, range_size, rank_coords, replica, span
from zerotune.costmodel.catalog import parse_cluster
from zerotune.trainer.launch import run_torchrun


def test_innermost_level_varies_fastest():
    c = parse_cluster("local:2x2x2")
    assert [rank_coords(c, r) for r in range(4)] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]
    assert all(coords_rank(c, rank_coords(c, r)) == r for r in range(8))


def test_span_groups_are_contiguous_blocks_and_replicas_strided():
    c = parse_cluster("local:2x2x2")
    assert range_ranks(c, 5, span(2)) == [4, 5, 6, 7]
    assert range_ranks(c, 5, span(1)) == [4, 5]
    assert range_ranks(c, 5, replica(c, 1)) == [1, 3, 5, 7]
    assert range_ranks(c, 5, (2, 2)) == [5, 7]
    assert range_size(c, replica(c, 3)) == 1 and range_ranks(c, 5, replica(c, 3)) == [5]


def test_range_index_matches_group_order():
    c = parse_cluster("local:2x4")
    for r in range(8):
        for levels in [(1, 1), (2, 2), (1, 2)]:
            assert range_ranks(c, r, levels).index(r) == range_index(c, r, levels)


def test_hung_run_is_killed_with_all_its_ranks(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import os, time\nopen(os.environ['MARK'] + os.environ['RANK'], 'w').write(str(os.getpid()))\n"
                      "time.sleep(600)\n")
    t0 = time.monotonic()
    result = run_torchrun(2, [str(script)], module=False, timeout_s=8, env={"MARK": str(tmp_path / "pid")})
    assert result.timed_out and not result.ok
    assert time.monotonic() - t0 < 30
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
    time.sleep(0.5)
    alive = subprocess.run(["ps", "-o", "pid=", "-p", ",".join(map(str, pids))], capture_output=True, text=True)
    assert alive.stdout.strip() == "", f"orphaned ranks: {alive.stdout}"


def test_failed_rank_is_reported(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nif os.environ['RANK'] == '1':\n    sys.exit('rank 1 broke: bad input')\n")
    result = run_torchrun(2, [str(script)], module=False, timeout_s=60)
    assert not result.ok and not result.timed_out
    assert "rank 1 broke" in result.output
