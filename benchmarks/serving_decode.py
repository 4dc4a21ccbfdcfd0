"""Decode throughput of the reference TP engine: TP=1 vs Hugging Face generate(), TP=2 vs
TP=1, and the time each decode step spends in all_reduce.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/serving_decode.py
    .venv/bin/python benchmarks/serving_decode.py --model neox-tiny --batch 4 --new-tokens 64
    .venv/bin/python benchmarks/serving_decode.py --tp 4 --backend nccl     # on a 4-GPU machine

Same random GPT-NeoX (conf/model/<model>.yaml, seed 1234, fp32), same batch of
`--batch` prompts of `--prompt-len` random tokens, greedy, `--new-tokens` generated, EOS
ignored. Every measurement burns in once (`--warmup` runs), then repeats `--repeats` times;
the median run is reported. HF and TP=1 runs alternate, and TP=1 is measured again after
the TP>1 launch, so that load from other processes falls on both sides of each ratio.

- decode tokens/s = batch × (new_tokens − 1) / decode time. Ours: the sum of the decode
  steps' wall times (the prefill step excluded). HF: generate(new_tokens) − generate(1),
  both with the KV cache (use_cache=True), so its prefill and setup cancel out.
- all_reduce per decode step: the union of the intervals during which an all_reduce was
  in flight inside the step's forward (workloads/training/commtimer.py; CUDA events on GPU), mean
  over decode steps; the step's share is that over the mean decode-step time.
TP>1 runs as a torchrun child of this script (`--worker`), which writes its figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def model_config(name: str):
    from omegaconf import OmegaConf

    from workloads.models.neox import NeoXConfig

    return NeoXConfig.from_dict(OmegaConf.to_container(OmegaConf.load(ROOT / "conf/model" / f"{name}.yaml")))


def prompts(cfg, batch: int, length: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randint(0, cfg.vocab_size, (batch, length), generator=g).tolist()


class OurEngine:
    """Our engine on this rank, built once; `once()` (rank 0) times one batch end to end."""

    def __init__(self, a, rank: int, world: int, device):
        import torch

        from workloads.inference.engine.engine import EngineSettings, build_engine
        from workloads.training.commtimer import CommTimer

        self.a, self.cfg, self.device = a, model_config(a.model), device
        kv = a.batch * (a.prompt_len + a.new_tokens + 16)
        self.eng = build_engine(self.cfg, EngineSettings(max_batch_size=a.batch, max_kv_tokens=kv), rank, world,
                                device, seed=1234)
        timer = CommTimer(device)
        run = self.eng.execute
        self.rows: list[tuple[float, float, int]] = []  # (step s, all_reduce s, tokens in step)

        def timed(entries):
            sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
            sync()
            timer.begin_step()
            t0 = time.perf_counter()
            with timer.active():  # only the forward: the plan broadcast is not counted
                out = run(entries)
            sync()
            self.rows.append((time.perf_counter() - t0, timer.end_step(), sum(len(e[0]) for e in entries)))
            return out

        self.eng.execute = timed

    def once(self) -> dict:
        from workloads.inference.engine.engine import SamplingParams

        a, done = self.a, []
        self.rows.clear()
        for p in prompts(self.cfg, a.batch, a.prompt_len):
            self.eng.submit(p, SamplingParams(max_tokens=a.new_tokens, temperature=0.0, ignore_eos=True),
                            lambda tok, reason: done.append(1) if reason else None)
        while self.eng.leader_step():
            pass
        assert len(done) == a.batch and self.rows[0][2] == a.batch * a.prompt_len
        decode = self.rows[1:]  # the first step is the prefill of the whole batch
        dt = sum(r[0] for r in decode)
        return {"decode_tok_s": a.batch * len(decode) / dt, "step_s": dt / len(decode),
                "allreduce_s": sum(r[1] for r in decode) / len(decode), "prefill_s": self.rows[0][0]}

    def stop(self) -> None:
        self.eng._broadcast({"kind": "stop"})


def median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["decode_tok_s"])[len(runs) // 2]


class HFGenerate:
    """transformers' GPTNeoXForCausalLM with the same weights (written and read back in HF's format)."""

    def __init__(self, a):
        import torch
        from transformers import AutoModelForCausalLM

        from workloads.models.hf import save_hf
        from workloads.models.neox import GPTNeoX

        self.a, cfg = a, model_config(a.model)
        from workloads.inference.engine.tp import RandomWeights

        model = GPTNeoX(cfg)
        model.load_state_dict(RandomWeights(cfg, 1234).state_dict())  # the weights build_engine(seed=1234) shards
        with tempfile.TemporaryDirectory() as d:
            save_hf(model, d)
            self.model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        self.ids = torch.tensor(prompts(cfg, a.batch, a.prompt_len))

    def _gen(self, n: int) -> float:
        import torch

        t0 = time.perf_counter()
        with torch.inference_mode():
            self.model.generate(input_ids=self.ids, attention_mask=torch.ones_like(self.ids), max_new_tokens=n,
                                min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0)
        return time.perf_counter() - t0

    def once(self) -> dict:
        full, one = self._gen(self.a.new_tokens), self._gen(1)
        return {"decode_tok_s": self.a.batch * (self.a.new_tokens - 1) / (full - one)}


def worker(a) -> None:
    import torch
    import torch.distributed as dist

    from workloads.core.dist import end_group_and_exit

    torch.set_num_threads(1 if a.backend == "gloo" else torch.get_num_threads())
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if a.backend == "nccl" else torch.device("cpu")
    if a.backend == "nccl":
        torch.cuda.set_device(device)
    ours = OurEngine(a, rank, world, device)
    if rank == 0:
        runs = [ours.once() for _ in range(a.warmup + a.repeats)][a.warmup:]
        ours.stop()
        Path(a.worker).write_text(json.dumps(median_run(runs)))
    else:
        ours.eng.run_follower()
    end_group_and_exit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="neox-125m", help="a conf/model/*.yaml name (random weights)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if a.backend == "gloo":
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    device = torch.device("cuda", 0) if a.backend == "nccl" else torch.device("cpu")
    print(f"model {a.model} (random, fp32), batch {a.batch}, prompt {a.prompt_len}, new tokens {a.new_tokens}, "
          f"{a.backend} on {torch.cuda.get_device_name(0) if a.backend == 'nccl' else 'CPU'}", flush=True)
    # HF and TP=1 alternate run by run, so that load from other processes hits both alike.
    hf = HFGenerate(a) if a.backend == "gloo" else None  # CPU only: HF on GPU would need its own placement
    ours = OurEngine(a, 0, 1, device)
    hf_runs, tp1_runs = [], []
    for i in range(a.warmup + a.repeats):
        h, o = (hf.once() if hf else None), ours.once()
        if i >= a.warmup:
            hf_runs.append(h)
            tp1_runs.append(o)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "tp.json"
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.tp}", __file__,
                "--worker", str(out)] + [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
                                         if k not in ("worker", "tp")]
        subprocess.run(argv, check=True, cwd=ROOT, env=os.environ | {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]},
                       timeout=3600)
        tpn = json.loads(out.read_text())
    tp1_runs += [ours.once() for _ in range(a.repeats)]  # TP=1 again after TP>1: both sides of its window
    tp1, hf = median_run(tp1_runs), (median_run(hf_runs) if hf else None)
    rows = [("HF generate()", hf["decode_tok_s"] if hf else None, None, None),
            ("reference TP=1", tp1["decode_tok_s"], tp1["step_s"], tp1["allreduce_s"]),
            (f"reference TP={a.tp}", tpn["decode_tok_s"], tpn["step_s"], tpn["allreduce_s"])]
    print(f"{'':18} {'decode tok/s':>12} {'ms/step':>9} {'all_reduce ms/step':>19} {'share':>6}")
    for name, tps, step, ar in rows:
        if tps is None:
            continue
        extra = f"{step * 1e3:9.2f} {ar * 1e3:19.3f} {ar / step:6.1%}" if step else ""
        print(f"{name:18} {tps:12.1f} {extra}")
    if hf:
        print(f"ratio TP=1 / HF generate decode tok/s: {tp1['decode_tok_s'] / hf['decode_tok_s']:.2f}")
    print(f"ratio TP={a.tp} / TP=1 decode tok/s: {tpn['decode_tok_s'] / tp1['decode_tok_s']:.2f}")
    print(f"all_reduce per decode step at TP={a.tp}: {tpn['allreduce_s'] * 1e3:.3f} ms "
          f"({tpn['allreduce_s'] / tpn['step_s']:.1%} of the step; {2 * model_config(a.model).num_layers} all_reduces)")


if __name__ == "__main__":
    main()
