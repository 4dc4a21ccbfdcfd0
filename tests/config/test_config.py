"""Every config file composes, and every bad value is one clear UsageError before init."""

import sys

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from helpers import REPO
from workloads.core.errors import UsageError
from workloads.core.rundir import derive_run_id, register_resolvers
from workloads.fabric.profile import FabricProfile
from workloads.models.neox import NeoXConfig
from workloads.training.run import BatchLayout, validate

CONF = REPO / "conf"
register_resolvers()


def cfg_with(*overrides, tmp_path=None):
    extra = [f"output_root={tmp_path}"] if tmp_path else []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[*overrides, *extra])


def test_train_keys_are_the_workload_files_keys():
    from workloads.training.run import TRAIN_KEYS

    for workload in ("pretrain", "finetune"):
        assert set(cfg_with(f"workload={workload}", "init.checkpoint=/x").train) == TRAIN_KEYS


def test_finetune_is_pretrain_but_for_what_it_states():
    """finetune.yaml inherits pretrain.yaml through its defaults list and states only what
    differs. init.checkpoint must stay required (`???`): OmegaConf keeps an earlier value under
    a later `???`, so a plain key in finetune.yaml would have left pretrain's null."""
    pre = OmegaConf.to_container(cfg_with("workload=pretrain"))
    fine = OmegaConf.to_container(cfg_with("workload=finetune"))
    assert fine["init"] == {"checkpoint": "???"} and pre["init"] == {"checkpoint": None}
    assert OmegaConf.is_missing(cfg_with("workload=finetune").init, "checkpoint")
    assert list(pre) == list(fine)  # the same sections in the same order
    differs = {(s, k) for s in pre if isinstance(pre[s], dict) for k in pre[s].keys() | fine[s].keys()
               if pre[s].get(k) != fine[s].get(k)}
    differs |= {(s, None) for s in pre if not isinstance(pre[s], dict) and pre[s] != fine[s]}
    assert differs == {("workload", "name"), ("train", "micro_batch_size"), ("train", "lr"), ("init", "checkpoint")}


def test_fabric_env_overrides_from_command_line():
    # Hydra needs a comma or '=' value quoted, or given as a list.
    cfg = cfg_with("fabric=roce", "fabric.env.NCCL_IB_HCA='=mlx5_0,mlx5_1'", "fabric.env.NCCL_IB_GID_INDEX=5",
                   "fabric.env.NCCL_SOCKET_IFNAME=[eth0,eth1]")
    prof = FabricProfile.from_config(OmegaConf.to_container(cfg.fabric, resolve=True))
    assert prof.env["NCCL_SOCKET_IFNAME"] == "eth0,eth1"
    env: dict = {"NCCL_IB_QPS_PER_CONNECTION": "stale"}
    applied = prof.apply(None, environ=env)
    assert applied["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"
    assert applied["NCCL_IB_GID_INDEX"] == "5"
    assert env["NCCL_IB_TC"] == "106"


def test_null_env_value_unsets_and_nccl_logs_per_process(tmp_path):
    prof = FabricProfile("x", "nccl", env={"NCCL_IB_HCA": None, "NCCL_IB_DISABLE": "1"})
    env = {"NCCL_IB_HCA": "mlx5_9"}
    applied = prof.apply(tmp_path, environ=env)
    assert "NCCL_IB_HCA" not in env and "NCCL_IB_HCA" not in applied
    assert applied["NCCL_DEBUG"] == "INFO"
    assert applied["NCCL_DEBUG_FILE"].endswith("nccl/nccl.%h.%p.log")


def test_model_shapes():
    for name, (L, h, heads) in {"neox-125m": (12, 768, 12), "neox-1.3b": (24, 2048, 16), "neox-2.7b": (32, 2560, 32),
                                "neox-6.7b": (32, 4096, 32), "pythia-160m": (12, 768, 12), "pythia-1.4b": (24, 2048, 16)}.items():
        m = NeoXConfig.from_dict(OmegaConf.to_container(cfg_with(f"model={name}").model))
        assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (L, h, heads)
        assert m.padded_vocab == 50304
        assert m.gpt_j_residual == name.startswith("pythia")


@pytest.mark.parametrize(
    "overrides,world,message",
    [
        (["train.micro_batch_size=0"], 2, "micro_batch_size must be a positive integer"),
        (["train.micro_batch_size=-3"], 2, "micro_batch_size must be a positive integer"),
        (["train.global_batch_size=10", "train.micro_batch_size=4"], 2, "not divisible by micro_batch_size"),
        (["train.seq_length=4096"], 2, "exceeds the model's max_position_embeddings=256"),
        (["model.hidden_size=66"], 2, "does not divide model.hidden_size=66"),
        (["train.steps=3", "train.warmup_steps=3"], 2, "must exceed train.warmup_steps"),
        (["train.warmup_steps=0"], 2, "warm-up must be at least 1 step"),
        (["train.precision=fp8"], 2, "train.precision='fp8'"),
        (["+train.micro_batchsize=2"], 2, "did you mean train.micro_batch_size"),
        (["train.steps=abc"], 2, "train.steps must be a positive integer, got 'abc'"),
        (["train.micro_batch_size=1.5"], 2, "train.micro_batch_size must be a positive integer, got 1.5"),
        (["train.lr=fast"], 2, "train.lr must be a number >= 0, got 'fast'"),
        (["dist.timeout_s=abc"], 2, "dist.timeout_s must be a positive number, got 'abc'"),
        (["train.activation_checkpointing=maybe"], 2, "train.activation_checkpointing must be true or false"),
        (["model=llama-3.1-8b"], 2, "has no GPT-NeoX shape"),
        (["train.precision=fp16"], 2, "fp16 needs a GPU"),
        (["fabric=roce"], 2, "needs a GPU"),
        (["workload=finetune"], 2, "needs init.checkpoint"),
        (["workload=finetune", "init.checkpoint=/no/such/ckpt"], 2, "does not exist"),
        (["data.kind=tokens"], 2, "needs data.path"),
        (["data.kind=tokens", "data.path=/no/such/file.bin"], 2, "does not exist"),
    ],
)
def test_bad_values_are_usage_errors(overrides, world, message, tmp_path):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("[", r"\[")):
        validate(cfg_with(*overrides, tmp_path=tmp_path), world)


def test_unwritable_output_root(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "file").write_text("")
    with pytest.raises(UsageError, match="not writable"):
        validate(cfg_with(f"output_root={ro / 'file' / 'sub'}"), 2)


def test_global_batch_derives_accumulation():
    layout = BatchLayout.resolve(micro=2, accum=1, global_batch=16, world=4)
    assert (layout.grad_accum_steps, layout.global_batch) == (2, 16)


def test_run_id_every_rank_derives_the_same():
    agent = "/tmp/torchelastic_ab/none_cd/attempt_0/{}/error.json"
    ids = {derive_run_id(None, {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_ERROR_FILE": agent.format(r)}) for r in range(4)}
    assert len(ids) == 1
    assert derive_run_id(None, {"SLURM_JOB_ID": "77", "TORCHELASTIC_RUN_ID": "x"}) == "slurm-77"
    assert derive_run_id(None, {"TORCHELASTIC_RUN_ID": "job/1 2"}) == "rdzv-job-1-2"
    assert derive_run_id("my run", {}) == "my-run"


def test_secrets_are_redacted_and_metrics_are_not():
    from workloads.core.redact import redact

    out = redact({"env": {"WANDB_API_KEY": "abc", "HF_TOKEN": "x", "NCCL_IB_HCA": "mlx5"},
                  "metrics": {"tokens_per_sec": 5.0}, "max_tokens": 3, "aws_secret_access_key": "k"})
    assert out["env"] == {"WANDB_API_KEY": "<redacted>", "HF_TOKEN": "<redacted>", "NCCL_IB_HCA": "mlx5"}
    assert out["metrics"]["tokens_per_sec"] == 5.0 and out["max_tokens"] == 3
    assert out["aws_secret_access_key"] == "<redacted>"
    assert redact(["+fabric.env.MY_SECRET_TOKEN=hunter2", "train.max_tokens=3", "fabric=roce"]) == [
        "+fabric.env.MY_SECRET_TOKEN=<redacted>", "train.max_tokens=3", "fabric=roce"]


def _groups(path) -> list[str]:
    entries = yaml.safe_load(path.read_text()).get("defaults", [])
    return [k.lstrip("/") for e in entries if isinstance(e, dict) for k in e if (CONF / k.lstrip("/")).is_dir()]


def _roots() -> dict[str, tuple[str, list[str], list[str]]]:
    """What composes each group, read from the files themselves, so that a group added to a root
    or a workload is built below without editing this test: each root config under conf/ with
    the groups its defaults list composes, and each workload that brings groups of its own
    (inference: server, load) as `workload=<name>` on the root config, with those groups.
    Values: (config name, the overrides that select it, groups)."""
    roots = {path.stem: (path.stem, [], _groups(path)) for path in sorted(CONF.glob("*.yaml"))}
    for path in sorted((CONF / "workload").glob("*.yaml")):
        if groups := _groups(path):
            roots[f"workload={path.stem}"] = ("config", [f"workload={path.stem}"], groups)
    return roots


ROOTS = _roots()
NOT_HYDRA_GROUPS = {"local": "a cluster's own optional overrides (git-ignored)", "study": "study specs, read by "
                    "`fabricbench study`", "tune": "tune specs, read by `fabricbench tune` (tests/study/test_tune.py)", "hydra": "Hydra's own groups (test_every_hydra_launcher_composes)"}


def test_every_group_folder_is_composed_by_a_root():
    composed = {g for _, _, groups in ROOTS.values() for g in groups}
    folders = {p.name for p in CONF.iterdir() if p.is_dir()}
    assert ROOTS.keys() >= {"config", "workload=inference", "serve"}
    assert folders - set(NOT_HYDRA_GROUPS) == composed, "a conf/ folder no root composes, or a root's group without a folder"


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "hydra" / "launcher").glob("*.yaml")))
def test_every_hydra_launcher_composes(name, tmp_path):
    """hydra/launcher files compose (and resolve) on every root that sweeps."""
    for base in ([], ["workload=inference"]):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[*base, f"hydra/launcher={name}", f"output_root={tmp_path}"],
                          return_hydra_config=True)
        launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
        assert launcher["_target_"].startswith("hydra_plugins."), launcher


def _build(root: str, group: str, cfg, tmp_path, monkeypatch):
    """The object a group's file selects, built the way its workload builds it."""
    if group == "fabric":
        return FabricProfile.from_config(OmegaConf.to_container(cfg.fabric, resolve=True))
    if group == "model":
        return NeoXConfig.from_dict(OmegaConf.to_container(cfg.model, resolve=True))
    if group == "workload" and cfg.workload.name == "link":
        from workloads.link.run import settings

        return settings(cfg)  # its Options; the whole validate also needs iperf3 here (tests/link)
    if group == "workload" and cfg.workload.name == "replay":
        from workloads.replay.run import validate as validate_replay

        return validate_replay(cfg, 2)  # the ReplayPlan, its trace read
    if group == "workload" and cfg.workload.name == "inference":
        from workloads.inference.run import validate as validate_sweep

        return validate_sweep(cfg, [])  # the SweepPlan, on the workload's own server and load defaults
    if group in ("parallel", "workload") and cfg.workload.name != "collectives":
        return validate(cfg, 2)  # a TrainPlan: batch layout, engine settings, the parallel dict
    if group == "workload":
        from workloads.collectives.run import validate as validate_collectives

        return validate_collectives(cfg, 2).settings
    if group == "logger":
        from types import SimpleNamespace

        from workloads.core.loggers import Tracking, build_loggers

        monkeypatch.setenv("WANDB_MODE", "disabled")
        monkeypatch.setenv("WANDB_DIR", str(tmp_path))
        tracking = Tracking.from_config(OmegaConf.to_container(cfg, resolve=True))
        loggers = build_loggers(tracking, SimpleNamespace(is_main=True, world_size=1, nodes=1))
        loggers.close()
        return loggers if cfg.logger.name == "none" else loggers[0]
    if root == "serve":
        from workloads.inference.engine.run import validate as validate_serve

        return validate_serve(cfg, 1)  # the ServePlan of launch/serve.py
    from workloads.inference.run import validate as validate_sweep

    return validate_sweep(cfg, [])  # server and load: the SweepPlan (adapter command, points, prompts)


@pytest.mark.parametrize("root,group", [(r, g) for r, (_, _, groups) in ROOTS.items() for g in groups])
def test_every_group_of_every_root_builds_its_object(root, group, tmp_path, monkeypatch):
    names = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    assert names, group
    for name in names:
        extra = [f"output_root={tmp_path}"]
        if name == "finetune":
            extra.append("init.checkpoint=/nonexistent")
        if name == "replay":
            extra.append(f"replay.trace={REPO / 'tests' / 'fixtures' / 'flight_recorder' / 'gloo_torch2.15_rank0.json'}")
        if root == "workload=inference" and group == "server":
            # weights at a local folder: where the engine is installed, a hub id this host has not
            # cached is refused before it starts (adapters/base.check_weights), and there is no network
            local = f"server.model_path={tmp_path}"
            extra += {"external": ["server.url=http://127.0.0.1:9"],
                      "sglang": ["model=llama-3.1-8b", f"server.python={sys.executable}", local],
                      "vllm": ["model=llama-3.1-8b", local], "vllm-pd": ["model=llama-3.1-8b", local],
                      # GPUs only (it refuses a CPU host): composed as for a GPU node
                      "sglang-pd": ["model=llama-3.1-8b", f"server.python={sys.executable}", "server.device=cuda", local],
                      }.get(name, [])
        if root == "workload=inference" and group == "load":  # GPU-sized loads: against a server of that size
            extra += ["server=external", "server.url=http://127.0.0.1:9", "model=llama-3.1-8b"]
        if root == "config" and group == "fabric" or group == "model" and root != "serve":
            # fabric/model files are checked as objects here; a GPU fabric or a served-only
            # model cannot also pass a CPU workload's validation.
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                cfg = compose(config_name=ROOTS[root][0], overrides=[*ROOTS[root][1], f"{group}={name}", *extra])
            assert _build(root, group, cfg, tmp_path, monkeypatch) is not None
            continue
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name=ROOTS[root][0], overrides=[*ROOTS[root][1], f"{group}={name}", *extra])
        assert (cfg.workload.name if group == "workload" else cfg[group].name) == name, (root, group, name)
        if root == "serve" and group == "server" and name != "reference":
            with pytest.raises(UsageError, match="reference engine only"):
                _build(root, group, cfg, tmp_path, monkeypatch)
            continue
        if name == "finetune":
            with pytest.raises(UsageError, match="checkpoint"):
                _build(root, group, cfg, tmp_path, monkeypatch)
            continue
        assert _build(root, group, cfg, tmp_path, monkeypatch) is not None, (root, group, name)
