"""Load generator for OpenAI-compatible streaming servers (SGLang, vLLM, the reference engine).

    datasets.py   load(tokenizer) -> list[RequestSpec]      (random, sharegpt)
    backends.py   how a request body is built and a chunk is read (completions, chat)
    client.py     the one streaming function that times TTFT / ITL / E2E
    arrivals.py   when each request is sent (poisson, gamma, burst, closed loop)
    runner.py     runs one load point, records each request's send lag
    metrics.py    pure functions: per-request results -> vLLM-named summary
"""
