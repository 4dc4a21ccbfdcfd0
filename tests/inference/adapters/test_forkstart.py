"""The reference engine on a study's kept topology, started without a fresh interpreter
(workloads/inference/adapters/forkstart.py), on real namespaces (root).

One served TP=2 run, started as a study starts it: a warm process (torch imported) builds the
topology, names it in KEPT_ENV and forks the run's emulator (study/fabrics.py: fork_run),
which forks the load generator, which forks the engine's watchdog, which forks the engine's
`--serve` process, which forks a torchrun agent into each node. Node 1's agent is killed
during the second point: the run must fail as the exec'd engine's does (its one line), the
first point's record stays on disk beside the failed one's, and no process of the run is left in
the nodes (the topology can be lent again). The study's own served runs (6 per test run, in
tests/study/test_latency_study.py) show the same path measuring.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import REPO, child_env, records_in

# the study's near arm and its TP=2 cell, with two points and a longer decode, so that the agent
# dies while the second point is being measured
ARGS = ["launch/infer.py", "fabric=emu-1g", "fabric.emulate.latency=500us", "server.tp=2", "load.points=[1,2]",
        "load.num_requests=3", "load.warmup_requests=0", "load.dataset.input_len=32", "load.dataset.output_len=32"]

DRIVER = r"""
import json, os, signal, sys, time
from pathlib import Path
import torch  # noqa: F401 - the study's warm state: the run's processes fork from it
from workloads import CONF_DIR
from workloads.core.config import compose
from workloads.fabric.emuplan import _spec_of
from workloads.fabric.kept import KEPT_ENV, fresh, handle
from workloads.fabric.netns import Topology
from workloads.inference.adapters.watchdog import family
from workloads.study.fabrics import fork_run

out, args = Path(sys.argv[1]), json.loads(sys.argv[2])
spec = _spec_of(compose(CONF_DIR, [o for o in args if o.startswith("fabric")]), {})[0]  # as the study's KeptFabrics
said = {}
with Topology(spec, tag=f"{os.getpid()}fk", host_link=True) as topo:
    env = dict(os.environ, **{KEPT_ENV: handle(topo)})
    argv = [sys.executable, "launch/emulate.py", *args, f"output_root={out}", "run_id=fk"]
    with open(out / "emulate.log", "w") as log:
        emu = fork_run(argv, env, log)
        said["forked_emulator"] = emu is not None
        names, killed = {}, None
        deadline = time.monotonic() + 400
        while emu.poll() is None and time.monotonic() < deadline:
            for pid in family(emu.pid):
                try:
                    names.setdefault(Path(f"/proc/{pid}/comm").read_text().strip(), pid)
                except OSError:
                    pass
            if killed is None and any((out / "fk" / "records").glob("*-c1-*.json")) and "fb-agent1" in names:
                killed = names["fb-agent1"]
                os.kill(killed, signal.SIGKILL)
                said["killed_at"] = time.monotonic()
            time.sleep(0.1)
        said["rc"] = emu.wait(60)
        said["stopped_s"] = time.monotonic() - said.get("killed_at", time.monotonic())
    said["names"] = sorted(names)
    # node 1's rank outlived its agent (as under an exec'd agent) and ends when rank 0's socket closes
    deadline = time.monotonic() + 30
    while not fresh(topo) and time.monotonic() < deadline:
        time.sleep(0.2)
    said["left_in_nodes"] = not fresh(topo)
print(json.dumps(said))
"""


@pytest.mark.requires("root")
@pytest.mark.timeout(600)
def test_a_forked_node_agent_that_dies_fails_the_run_in_one_line_and_keeps_what_was_measured(tmp_path):
    r = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path), json.dumps(ARGS)], cwd=REPO, env=child_env(),
                       capture_output=True, text=True, timeout=560)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    said = json.loads(r.stdout.splitlines()[-1])
    out = (tmp_path / "emulate.log").read_text()
    assert said["forked_emulator"] and "kept for the study's arm" in out, out[-3000:]
    # nothing of the engine's chain was a fresh interpreter: each is a named fork
    assert {"fb-loadgen", "fb-watchdog", "fb-serve", "fb-agent0", "fb-agent1"} <= set(said["names"]), said
    log = (tmp_path / "fk" / "server" / "reference.log").read_text()
    assert "forked from the warm load generator" in log, log[-3000:]
    # the exec'd engine's failure, said the same way: the agent's node in the server log, the
    # point in one error line of the run's
    assert "error: node 1 (" in log and "exited with code -9" in log, log[-3000:]
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "server=reference exited with code" in errors[0] and "during point c2" in errors[0], \
        out[-3000:]
    assert said["rc"] != 0 and said["stopped_s"] < 60, said
    recs = {rec["point"]: rec["status"] for rec in records_in(tmp_path / "fk")}
    assert recs == {"c1": "ok", "c2": "failed"}, recs
    assert not said["left_in_nodes"], said  # every process of the run is gone from the kept nodes
