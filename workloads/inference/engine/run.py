"""`run_server(cfg)`: validate, apply the fabric, init, build the engine, serve, clean up.

Rank 0 runs the HTTP server (asyncio, main thread) and the engine's leader loop (a
thread); every other rank runs the follower loop. Shutdown (SIGTERM/SIGINT to any rank,
or torchrun forwarding one): rank 0 stops listening, fails what is still in flight,
broadcasts `stop`, and every rank leaves; a follower whose leader is gone exits by
itself after `server.shutdown_grace_s`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from workloads import session
from workloads.core import dist as fdist
from workloads.core.errors import UsageError
from workloads.fabric.profile import FabricProfile
from workloads.fabric.verify import check_transport
from workloads.fabric.verify_server import report_transport
from workloads.inference.engine.engine import EngineSettings
from workloads.inference.engine.tp import check_tp
from workloads.models.neox import NeoXConfig


@dataclass(frozen=True)
class ServePlan:
    """The reference server, checked once before any rank starts; everything below the entry
    function reads this, never the Hydra config."""

    model: NeoXConfig
    model_name: str
    settings: EngineSettings
    fabric: FabricProfile
    checkpoint: str | None
    tokenizer: str | None
    eos_token_id: int | None
    host: str
    port: int
    seed: int                 # the same random weights on every rank (no checkpoint)
    shutdown_grace_s: float   # a follower's wait for the leader's stop before it exits by itself
    run: session.RunContext


def _has_tokenizer(p: Path) -> bool:
    return any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))


def validate(cfg: DictConfig, world: int) -> ServePlan:
    """Everything checkable before a process group exists. Raises UsageError."""
    s = cfg.server
    if s.name != "reference":
        raise UsageError(f"launch/serve.py runs the reference engine only; server={s.name} is started and swept by "
                         f"launch/infer.py server={s.name}")
    fabric = session.prepare(cfg)
    checkpoint = s.get("checkpoint") or None
    eos = s.get("eos_token_id")
    if checkpoint:
        from workloads.models.hf import check_checkpoint_dir, load_hf_config

        if not Path(checkpoint).expanduser().is_dir():
            raise UsageError(f"server.checkpoint={checkpoint} does not exist; point it at a local Hugging Face "
                             "GPT-NeoX/Pythia directory (config.json + weights), or leave it null for random weights")
        ckpt = check_checkpoint_dir(checkpoint)
        model = load_hf_config(ckpt)
        name = s.get("served_model_name") or ckpt.name
        if eos is None:
            eos = json.loads((ckpt / "config.json").read_text()).get("eos_token_id")
    else:
        from workloads.inference.protocol import dense_only

        dense_only(OmegaConf.to_container(cfg.model, resolve=True))
        model = NeoXConfig.from_dict(OmegaConf.to_container(cfg.model, resolve=True))
        name = s.get("served_model_name") or cfg.model.name
    tp = s.get("tp")
    if tp is not None and int(tp) != world:
        raise UsageError(f"server.tp={tp} but {world} rank(s) were started; start --nproc_per_node={tp} "
                         f"or set server.tp={world} (or null)")
    check_tp(model, world)
    tokenizer = s.get("tokenizer") or None
    if tokenizer is None and checkpoint and _has_tokenizer(Path(checkpoint)):
        tokenizer = str(checkpoint)
    if tokenizer is not None and not Path(tokenizer).expanduser().is_dir():
        raise UsageError(f"server.tokenizer={tokenizer} is not a directory; point it at a local Hugging Face "
                         "tokenizer directory, or leave it null and send prompts as token ids")
    port = int(s.port)
    if not 0 <= port < 65536:
        raise UsageError(f"server.port={port} is not a TCP port")
    settings = EngineSettings(max_batch_size=int(s.max_batch_size), max_kv_tokens=int(s.max_kv_tokens),
                              kv_block_size=int(s.kv_block_size), max_queue=int(s.max_queue),
                              heartbeat_s=float(s.heartbeat_s), dtype=str(s.dtype))
    return ServePlan(model, name, settings, fabric, checkpoint, tokenizer, None if eos is None else int(eos),
                     host=str(s.host), port=port, seed=int(cfg.seed), shutdown_grace_s=float(s.shutdown_grace_s),
                     run=session.context(cfg))


def run_server(cfg: DictConfig) -> int:
    import torch

    from workloads.inference.engine.engine import build_engine
    from workloads.inference.engine.server import Server
    from workloads.models.tokenizer import load_tokenizer

    _, world, _, _ = fdist.launch_env()
    plan = validate(cfg, world)
    tokenizer = load_tokenizer(plan.tokenizer, "server.tokenizer")
    eos = plan.eos_token_id
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads()))))
    info, run_dir, _ = session.start(plan.run, plan.fabric)
    engine = build_engine(plan.model, plan.settings, info.rank, info.world_size, info.device, plan.seed,
                          plan.checkpoint, eos)
    # Every rank, before serving: which wire the TP all_reduces use (a mismatch under
    # fabric.verify=fail stops the server here, with one message in its log). NCCL >= 2.22
    # connects channels at the first collective, not at init: read the log after real ones.
    fdist.warmup_collectives(info.device)
    transport = check_transport(plan.fabric, run_dir, info)
    if info.is_main:
        report_transport(transport)

    if not info.is_main:
        grace = plan.shutdown_grace_s

        def on_term(*_):  # the leader normally broadcasts `stop` within a heartbeat
            t = threading.Timer(grace, os._exit, (0,))
            t.daemon = True
            t.start()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        try:
            engine.run_follower()
        except RuntimeError:
            pass  # the leader went away: nothing left to serve
        return 0

    # Warm-up: one real step through every rank (collectives proven) before /health says ready.
    engine.submit([0], _warmup_params(), lambda tok, reason: None)
    while engine.leader_step():
        pass
    server = Server(engine, plan.model_name, tokenizer)
    print(f"engine ready: tp={info.world_size} ({plan.fabric.name}/{info.backend}), model {plan.model_name}, "
          f"max_batch_size={plan.settings.max_batch_size}, KV cache {plan.settings.max_kv_tokens} tokens "
          f"({engine.kv_bytes_per_rank() / 2**20:.1f} MiB per rank)", flush=True)
    return asyncio.run(_lead(engine, server, plan.host, plan.port))


def _warmup_params():
    from workloads.inference.engine.engine import SamplingParams

    return SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


async def _lead(engine, server, host: str, port: int) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def leader():
        try:
            engine.run_leader()
        finally:
            loop.call_soon_threadsafe(stop.set)  # a dead engine takes the server down with it

    thread = threading.Thread(target=leader, name="engine-leader", daemon=True)
    thread.start()
    from workloads.inference.engine.server import serve

    try:
        await serve(server, host, port, stop, before_close=lambda: _stop_engine(engine, thread))
    finally:
        await asyncio.to_thread(_stop_engine, engine, thread)
    if engine.failure:
        print(f"error: the engine failed: {engine.failure}", flush=True)
        return 1
    print("server stopped", flush=True)
    return 0


def _stop_engine(engine, thread: threading.Thread) -> None:
    engine.request_stop()
    thread.join(timeout=60)
