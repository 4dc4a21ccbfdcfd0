"""Reference inference server: tensor-parallel GPT-NeoX behind an OpenAI-compatible API.

    torchrun --nproc_per_node=2 launch/serve.py model=neox-tiny fabric=loopback server.port=8000
    torchrun --nproc_per_node=2 launch/serve.py server.checkpoint=/models/pythia-160m server.dtype=bf16

Launch and readiness contract (what a load generator's `reference` adapter relies on):

- Start, with cwd = the repository root and no self-launch:
      python -m torch.distributed.run --standalone --nproc_per_node=<tp> launch/serve.py \
          model=<m> fabric=<f> server.host=<h> server.port=<p> \
          [server.checkpoint=<hf dir>] [server.tokenizer=<dir>]
  `--nproc_per_node` is the tensor-parallel degree (server.tp, if set, must equal it).
- Ready when GET http://<h>:<p>/health answers 200: the port is opened only after the
  weights are sharded and one warm-up step has run on every rank. /health answers 503
  once the engine has stopped. A bad config exits with status 2 and one `error:` line.
- GET /v1/models lists one model whose id is `model.name`, or the checkpoint
  directory's name (server.served_model_name overrides both).
- POST /v1/completions (`prompt`: text or a list of token ids) and
  /v1/chat/completions, streaming (SSE `data: {...}` chunks, then `data: [DONE]`) or
  not; `stream_options.include_usage` adds a final chunk with `choices: []` and `usage`
  {prompt_tokens, completion_tokens, total_tokens}; `max_tokens`, `min_tokens`,
  `ignore_eos`, `temperature`, `top_p`, `seed` honoured.
- SIGTERM (to torchrun, which forwards it, or to rank 0) stops every rank cleanly.

The work lives in workloads/inference/engine/ (run.py orchestrates).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run(cfg, overrides):
    from workloads.inference.engine.run import run_server

    return run_server(cfg)


if __name__ == "__main__":
    from workloads.commands.entry import hydra_entry

    # torchrun places the ranks (one per TP shard); see the contract above.
    hydra_entry(__file__, run, config_name="serve", distributed=False)
