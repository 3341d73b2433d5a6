"""Training: token set-up, masking, TRL SFT with PEFT LoRA, export."""
