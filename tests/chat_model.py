"""A small model directory for tests: a byte-level BPE ``tokenizer.json`` trained here with the
``tokenizers`` library (Llama 3's pre-tokenizer regex, its special tokens, BOS added to plain
prompts) and a ``tokenizer_config.json`` with Llama 3's chat template. Real files read by the
real libraries, only smaller than a real model's (no download: the tests run offline)."""

from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = ["LLAMA3_TEMPLATE", "SPECIALS", "make_model_dir"]

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]  # fmt: skip
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
_TEXT = ("the cat sat on a mat while hello world it's don't we'll 12345 2024 naïve über café "
         "naïf ∑ → — “quoted” {json: [1, 2]} def f(x): return x*2 \n\n\t tab")  # fmt: skip
_WORDS = _TEXT.split(" ")


def make_model_dir(path: Path, *, vocab_size: int = 800, template: str | None = LLAMA3_TEMPLATE
                   ) -> Path:  # fmt: skip
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    rng = random.Random(7)
    corpus = [" ".join(rng.choice(_WORDS) for _ in range(40)) for _ in range(400)]
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    config: dict[str, object] = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    if template is not None:
        config["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path
