"""Chat prompts as a model sees them: its own tokenizer and chat template."""
