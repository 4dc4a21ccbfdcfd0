"""Disaggregated prefill/decode serving (server=vllm-pd): the proxy that routes each request
to a prefill then a decode instance (proxy.py), the process that starts both and the proxy
(serve.py), and the readers of their logs (kvlog.py: vLLM's KV-transfer metrics)."""
