"""Expert parallelism with data-parallel attention: one process per rank, each with its own requests,
caches and scheduler; dense weights replicated, experts partitioned (plus redundant copies, EPLB); the
MoE's dispatch/combine ops exchange rows over torch.distributed (gloo on CPU, NCCL between GPUs)."""
