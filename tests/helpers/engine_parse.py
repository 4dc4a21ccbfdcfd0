"""Parse command lines with an engine's own argument parser; runs INSIDE the engine's
interpreter (.engines/<engine>/bin/python), never in fabricbench's.

    <engine python> tests/helpers/engine_parse.py sglang|vllm  < [[argv...], ...] (JSON)  > [{dest: value} | {"error": msg}, ...]

argv is the whole command line the adapter built (program first). Each parses exactly as
the engine's own entry point does: SGLang's `prepare_server_args` (what
`python -m sglang.launch_server` calls); vLLM's `make_arg_parser` on a
`FlexibleArgumentParser` plus `validate_parsed_serve_args` (what both
`vllm serve` and `python -m vllm.entrypoints.openai.api_server` call). A rejected command line gives
`{"error": ...}` with the engine's own argparse message (what it wrote to stderr before
exiting), so one interpreter start (the engine's import is most of the cost) parses every
case, accepted or not.
"""

import contextlib
import io
import json
import sys


def sglang(argv):
    from sglang.srt.server_args import prepare_server_args

    assert argv[1:3] == ["-m", "sglang.launch_server"], argv[:3]
    a = prepare_server_args(argv[3:])
    keys = ("model_path", "tp_size", "host", "port", "nnodes", "node_rank", "dist_init_addr", "served_model_name",
            "mem_fraction_static")
    if a.disaggregation_mode != "null":  # a P/D instance (server=sglang-pd)
        keys += ("disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_bootstrap_port",
                 "disaggregation_ib_device")
    return {k: getattr(a, k) for k in keys}


def vllm(argv):
    from vllm.entrypoints.launchers.cli_args import (
        make_arg_parser,
        validate_parsed_serve_args,
    )
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])
    elif argv[1].endswith("engines/vllm_headless.py"):  # a headless node: the same parser (that file)
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[2:])
    else:
        assert argv[1] == "serve", argv[:2]
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[2:])
        args.model = args.model_tag or args.model  # what `vllm serve` does with its positional model
    validate_parsed_serve_args(args)
    return {k: getattr(args, k) for k in ("model", "tensor_parallel_size", "host", "port", "nnodes", "node_rank",
                                          "master_addr", "master_port", "headless", "served_model_name",
                                          "max_num_seqs", "dtype")}


def _one(parse, argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse(argv)
    except SystemExit as e:  # argparse's error(): usage and message on stderr, then exit 2
        return {"error": err.getvalue().strip() or f"exit {e.code}"}


if __name__ == "__main__":
    parse = {"sglang": sglang, "vllm": vllm}[sys.argv[1]]
    print(json.dumps([_one(parse, a) for a in json.load(sys.stdin)], default=str))
