"""The reference inference engine: tensor-parallel GPT-NeoX (tp.py), continuous batching (engine.py), OpenAI-compatible HTTP (server.py), orchestration (run.py)."""
