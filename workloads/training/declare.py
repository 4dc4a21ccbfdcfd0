"""What pretrain and finetune declare to the catalog: their typed config keys and their metrics
(docs/metrics.md defines each). The `train:` section's names are TRAIN_KEYS' source."""

from workloads.catalog import Metric
from workloads.core.schema import COUNT, INDEX, OPT_COUNT, Flag, Num

KEYS = {
    "train.micro_batch_size": COUNT, "train.grad_accum_steps": COUNT, "train.global_batch_size": OPT_COUNT,
    "train.seq_length": COUNT, "train.steps": COUNT, "train.warmup_steps": INDEX, "train.lr": Num(False, 0),
    "train.weight_decay": Num(False, 0), "train.grad_clip": Num(False, 0), "train.activation_checkpointing": Flag(),
    "parallel.bucket_cap_mb": Num(False, 0, lo_open=True), "parallel.zero_stage": Num(True, 0, 3),
    "parallel.overlap_comm": Flag(), "parallel.reduce_bucket_size": COUNT, "parallel.allgather_bucket_size": COUNT,
    "parallel.expert_parallel": COUNT, "parallel.tensor_parallel": COUNT, "parallel.data_parallel": OPT_COUNT,
    "model.moe.num_experts": COUNT, "model.moe.top_k": COUNT, "model.moe.capacity_factor": Num(False, 0, lo_open=True),
    "model.moe.aux_loss_coef": Num(False, 0), "model.moe.expert_ffn_size": OPT_COUNT,
}

METRICS = (
    Metric("samples_per_sec", "samples/s", True, "faster"),
    Metric("iteration_time_std(s)", "s", False),   # the spread of step times, not speed
    Metric("tflops_per_gpu", "TFLOPS", True, "faster"),
    Metric("mfu", "fraction", True),
    Metric("comm_share", "fraction", False),
    Metric("final_loss", "nats", False), Metric("loss", "nats", False),
    # MoE: the all-to-all's share of a step and the router's balance (not speed)
    Metric("alltoall_share", "fraction", False), Metric("dispatch_share", "fraction", False),
    Metric("combine_share", "fraction", False), Metric("routing_skew*", "max/mean", False),
    Metric("dropped_fraction", "fraction", False),
)
