"""tokenweir backends: the SGLang launcher and a CPU emulator of an SGLang server."""
