"""Peak GPU memory of a training recipe, estimated from the model's shape: weights + LoRA + optimizer + activations.

    estimate = estimate_memory(SHAPES["meta-llama/Llama-3.1-8B-Instruct"], Setup(batch_size=4, max_length=2048))
    print(estimate.total_gb, estimate.formula())

Per GPU, in bytes (``P`` base parameters, of which ``E`` embedding + head; ``n`` LoRA parameters; ``G`` GPUs
that shard with FSDP, else 1; ``B`` batch, ``L`` length, ``h`` hidden, ``l`` layers, ``V`` vocabulary, ``f`` the
share of positions that carry a label):

* weights      ``(P - E) * w + E * 2`` / G: ``w`` = 2 (bf16) or 0.5156 (NF4 with double quantisation: 4 bits + an
  8-bit absmax per 64 weights + a 32-bit one per 256 blocks); bitsandbytes keeps the embedding and head in bf16.
* LoRA         ``n * (4 + 4 + o)`` / G: fp32 weights and gradients, AdamW's two fp32 moments (``o`` = 8), or
  ``o`` = 2 for the 8-bit paged AdamW of the QLoRA recipe.
* activations  with gradient checkpointing ``l * B*L*h*2`` (each layer's input kept in bf16) plus one layer
  recomputed, ``B*L*h*34`` (Korthikanti et al. 2022, 16-bit, fused/SDPA attention: no ``5*a*L/h`` term);
  without it ``l * B*L*h*34``. Not sharded by FSDP.
* logits       ``B*L*f*V*10``: the loss projects only the labelled positions (``masked_loss``): bf16 logits, their
  fp32 copy and its gradient.
* overhead     1.5 GB: the CUDA context, cuBLAS workspaces and allocator fragmentation (a rule of thumb).

The CPU branch (``Setup(device="cpu")``, a CPU recipe: fp32 weights, ``dtype: float32``) is the same sum with
4-byte elements: weights ``P * 4``, activations ``34 * 2`` bytes per layer element (``* 2`` kept with
checkpointing), logits ``B*L*f*V*8`` (fp32 logits and their gradient: the loss's fp32 copy is the same tensor),
and instead of the CUDA overhead the resident memory of a training process before its model loads
(``CPU_OVERHEAD_GB``: Python, torch, transformers, TRL, PEFT, the records and a 128k-entry tokenizer, measured
on the development machine); the estimate is then of the process's peak RSS.

An estimate, checked on a GPU against the device's measured peak (the 8B LoRA recipe: results/gpu.md);
scripts/gpu_check.sh reports the measured peak next to it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

GB = 1024**3
#: Bytes per base weight: bf16, and bitsandbytes NF4 with double quantisation (4 + 8/64 + 32/(64*256) bits).
WEIGHT_BYTES = {"bf16": 2.0, "nf4": (4 + 8 / 64 + 32 / (64 * 256)) / 8, "fp32": 4.0}
#: Bytes per activation element kept by one transformer layer per token and hidden unit (16-bit, SDPA attention).
LAYER_ACTIVATION_BYTES = 34
OVERHEAD_GB = 1.5
#: Resident memory of a ``selfrag train`` process on CPU besides its model (measured on the development machine:
#: 0.45 GB after importing torch/transformers/peft/trl; 0.99 GB peak for a toy model of 0.1 GB with the 128k tokenizer)
CPU_OVERHEAD_GB = 0.9
CARDS_GB = (24, 40, 80)


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of an architecture (from its config.json)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        """The shape of a ``config.json`` (its dict)."""
        return cls(int(config["num_hidden_layers"]), int(config["hidden_size"]), int(config["intermediate_size"]),
                   int(config["num_attention_heads"]), int(config.get("num_key_value_heads")
                                                           or config["num_attention_heads"]),
                   int(config["vocab_size"]), bool(config.get("tie_word_embeddings", False)))

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of every linear layer of one block: q, k, v, o, gate, up, down."""
        kv = self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]

    @property
    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def parameters(self) -> int:
        block = sum(a * b for a, b in self.linear_shapes()) + 2 * self.hidden
        return self.layers * block + self.embedding_parameters + self.hidden


#: Shapes of the recipes' bases and the stand-ins (their config.json), so a dry run needs no download.
SHAPES: dict[str, ModelShape] = {
    "meta-llama/Llama-3.1-8B-Instruct": ModelShape(32, 4096, 14336, 32, 8, 128256),
    "meta-llama/Llama-3.2-3B-Instruct": ModelShape(28, 3072, 8192, 24, 8, 128256, tied=True),
    "meta-llama/Llama-3.2-1B-Instruct": ModelShape(16, 2048, 8192, 32, 8, 128256, tied=True),
    "Qwen/Qwen2.5-7B-Instruct": ModelShape(28, 3584, 18944, 28, 4, 152064),
}


@dataclass(frozen=True)
class Setup:
    """How the model trains: the recipe's batch, length, LoRA rank and the memory-relevant switches."""

    batch_size: int = 4
    max_length: int = 2048
    rank: int = 16
    quantization: Literal["bf16", "nf4", "fp32"] = "bf16"  # the base weights; fp32: a CPU recipe
    optimizer_state_bytes: float = 8.0  # AdamW: two fp32 moments; 2.0 for paged_adamw_8bit
    gradient_checkpointing: bool = True
    lora_on_embeddings: bool = True  # tokens.strategy reserved: LoRA on embed_tokens and lm_head too
    shards: int = 1  # GPUs that FSDP shards the weights and LoRA states over
    labelled_share: float = 0.5  # f: share of positions with a label (the loss projects only those)
    device: Literal["cuda", "cpu"] = "cuda"  # cpu: 4-byte activations and logits, the process's RSS overhead


@dataclass(frozen=True)
class MemoryEstimate:
    weights_gb: float
    lora_gb: float
    activations_gb: float
    logits_gb: float
    overhead_gb: float
    lora_parameters: int
    setup: Setup

    @property
    def total_gb(self) -> float:
        return self.weights_gb + self.lora_gb + self.activations_gb + self.logits_gb + self.overhead_gb

    def fits(self, card_gb: float) -> bool:
        return self.total_gb <= card_gb * 0.95  # 5% the driver and other processes keep

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "setup"}, "total_gb": round(self.total_gb, 2),
                "setup": asdict(self.setup), "formula": self.formula()}

    def formula(self) -> str:
        return (f"weights {self.weights_gb:.2f} + LoRA/grad/optimizer {self.lora_gb:.2f} + activations "
                f"{self.activations_gb:.2f} + logits {self.logits_gb:.2f} + overhead {self.overhead_gb:.2f} "
                f"= {self.total_gb:.2f} GB per GPU")


def lora_parameters(shape: ModelShape, rank: int, on_embeddings: bool) -> int:
    """LoRA parameters for ``target_modules: all-linear`` (plus the embedding and head: strategy reserved)."""
    per_block = sum(rank * (a + b) for a, b in shape.linear_shapes())
    embeddings = 2 * rank * (shape.vocab + shape.hidden) if on_embeddings else 0
    return shape.layers * per_block + embeddings


def estimate_memory(shape: ModelShape, setup: Setup) -> MemoryEstimate:
    """The per-GPU peak of one training step (see the module docstring for each term)."""
    base = shape.parameters - shape.embedding_parameters
    embedding_bytes = 4 if setup.quantization == "fp32" else 2  # bitsandbytes keeps the embedding and head in bf16
    weights = (base * WEIGHT_BYTES[setup.quantization] + shape.embedding_parameters * embedding_bytes) / setup.shards
    n = lora_parameters(shape, setup.rank, setup.lora_on_embeddings)
    lora = n * (4 + 4 + setup.optimizer_state_bytes) / setup.shards
    tokens = setup.batch_size * setup.max_length
    element = 4 if setup.device == "cpu" else 2  # bytes of an activation: fp32 on CPU, bf16 autocast on GPU
    layer = tokens * shape.hidden * LAYER_ACTIVATION_BYTES * element // 2
    if setup.gradient_checkpointing:
        activations = shape.layers * tokens * shape.hidden * element + layer
    else:
        activations = shape.layers * layer
    logit_bytes = 8 if element == 4 else 10  # logits + fp32 copy + its gradient (fp32 logits are their own copy)
    logits = tokens * setup.labelled_share * shape.vocab * logit_bytes
    overhead = CPU_OVERHEAD_GB if setup.device == "cpu" else OVERHEAD_GB
    return MemoryEstimate(weights / GB, lora / GB, activations / GB, logits / GB, overhead, n, setup)


def recipe_setups(batch_size: int = 4, max_length: int = 2048) -> dict[str, Setup]:
    """The three ways the README compares: 8B LoRA bf16 on one GPU, QLoRA NF4, FSDP over 8 GPUs."""
    return {
        "LoRA bf16, 1 GPU": Setup(batch_size, max_length),
        "QLoRA NF4, 1 GPU": Setup(batch_size, max_length, quantization="nf4", optimizer_state_bytes=2.0),
        "LoRA bf16, FSDP x8": Setup(batch_size, max_length, lora_on_embeddings=False, shards=8),
    }


def memory_table(shape: ModelShape, batch_size: int = 4, max_length: int = 2048) -> list[dict[str, Any]]:
    """One row per recipe: the estimate and whether it fits a 24 / 40 / 80 GB card."""
    rows = []
    for name, setup in recipe_setups(batch_size, max_length).items():
        estimate = estimate_memory(shape, setup)
        rows.append({"recipe": name, "estimate_gb": round(estimate.total_gb, 1),
                     **{f"fits_{card}gb": estimate.fits(card) for card in CARDS_GB}, "formula": estimate.formula()})
    return rows
