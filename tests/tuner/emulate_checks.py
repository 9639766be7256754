"""One rank of test_emulate.py's timing check, started inside its emulated group's namespace.

    python emulate_checks.py RANK WORLD MASTER_ADDR PORT NBYTES OUT.json

Every rank joins a gloo group (bound to its namespace's interface by GLOO_SOCKET_IFNAME), then times an
all-gather of NBYTES in total inside two subgroups: ranks 0 and 1 (one namespace: loopback) and ranks 0
and 2 (two namespaces: the shaped link), and rank 0's receipt of NBYTES/2 sent by rank 2 (one direction of
the shaped link). Rank 0 writes the fastest of five timings of each (noise on a shared machine only adds
time; the shaped rate bounds it from below).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    rank, world, master, port, nbytes, out = sys.argv[1:7]
    r, w = int(rank), int(world)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=r, world_size=w,
                            timeout=timedelta(seconds=90))
    groups = {"intra": dist.new_group([0, 1]), "cross": dist.new_group([0, 2])}
    members = {"intra": (0, 1), "cross": (0, 2)}
    timings: dict[str, float] = {}
    for name, group in groups.items():
        if r in members[name]:
            x = torch.ones(int(nbytes) // 4 // 2)
            out_t = torch.empty(x.numel() * 2)
            dist.all_gather_into_tensor(out_t, torch.ones(2)[:1].repeat(x.numel()), group=group)  # connect, warm up
            runs = []
            for _ in range(5):
                dist.barrier(group=group)
                start = time.perf_counter()
                dist.all_gather_into_tensor(out_t, x, group=group)
                runs.append(time.perf_counter() - start)
            timings[name] = min(runs)
            timings[name + "_runs"] = runs
        dist.barrier()
    if r in (0, 2):  # one direction of the link: rank 0 times until the last byte from rank 2 has arrived
        x = torch.ones(int(nbytes) // 4 // 2)
        runs = []
        for _ in range(5):
            dist.barrier(group=groups["cross"])
            start = time.perf_counter()
            if r == 2:
                dist.send(x, dst=0)
            else:
                dist.recv(x, src=2)
            runs.append(time.perf_counter() - start)
        timings["send"], timings["send_runs"] = min(runs), runs
    dist.barrier()
    if r == 0:
        with open(out, "w") as f:
            json.dump(timings, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
