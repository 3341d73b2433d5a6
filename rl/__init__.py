"""RL on outcomes: GRPO on a trained Self-RAG model, its rollouts decoded by the runtime with retrieval in the loop.

    selfrag rl --config configs/rl/smollm2-135m-cpu.yaml model=runs/smollm2-selfrag output_dir=runs/smollm2-rl

``run`` orchestrates; ``config`` (settings), ``policy`` (loading the policy, choosing the rollouts' engine),
``rollout`` (one rollout: the runtime's long form with sampled decisions), ``rollout_function`` (TRL's
``rollout_func``), ``merge`` (the LoRA folded in while rollouts decode), ``vllm_rollouts`` (the live LoRA served by
vLLM), ``reward`` (the terms), ``trainer`` (TRL's GRPOTrainer, built), ``history`` (``rewards.json``'s rows).
"""
