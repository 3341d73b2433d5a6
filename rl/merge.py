"""The LoRA folded into the base weights while the rollouts decode, and put back exactly after.

    merged = MergedLora()
    if MergedLora.applies(model):
        merged.merge(model); ...; merged.unmerge(model)
"""

from __future__ import annotations

from typing import Any


class MergedLora:
    """The LoRA folded into the base weights while the rollouts decode (``rollout.merge_lora``): the decode then runs
    a plain model, without the LoRA wrappers' kernels (benchmarks/rollout_profile.py measures the difference; docs/rl.md
    has the figures). PEFT's unmerge rounds (in bfloat16 a merge and unmerge a step moved the weights by 0.24% rms over
    100 steps, half a LoRA update's size), so the weights are put back from a copy of them taken once (the base is
    frozen): exact, at the memory of a second copy of the adapted weights on their device (14 GB on the 8B shape,
    0.5 GB on SmolLM2-135M in float32)."""

    def __init__(self) -> None:
        self.originals: dict[str, Any] = {}

    @staticmethod
    def applies(model: Any) -> bool:
        """A PEFT model whose base is not quantised (4/8-bit weights cannot be put back by a copy)."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else None
        return base is not None and hasattr(model, "merge_adapter") and not getattr(base, "is_quantized", False) \
            and not getattr(base, "is_loaded_in_4bit", False) and not getattr(base, "is_loaded_in_8bit", False)

    def merge(self, model: Any) -> None:
        import torch

        if not self.originals:
            with torch.no_grad():
                self.originals = {name: tensor.detach().clone() for name, tensor in self._base_weights(model).items()}
        model.merge_adapter()

    def unmerge(self, model: Any) -> None:
        import torch

        model.unmerge_adapter()  # PEFT's own state (which adapters are merged) back to unmerged
        with torch.no_grad():
            for name, tensor in self._base_weights(model).items():
                tensor.copy_(self.originals[name])

    @staticmethod
    def _base_weights(model: Any) -> dict[str, Any]:
        """The frozen tensors a merge writes: the weights of every adapted layer's base layer."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        found = {}
        for name, module in model.named_modules():
            if isinstance(module, BaseTunerLayer):
                base = module.get_base_layer()
                for key, tensor in base.named_parameters(recurse=False):
                    found[f"{name}.{key}"] = tensor
        return found
