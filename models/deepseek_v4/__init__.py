"""DeepSeek-V4-Flash (`model_type` `deepseek_v4`): config, layer plans, the step graph, checkpoints."""
