"""The llama.cpp engine: ``engine.py`` decodes a job's samples with llama.cpp through its Python binding
(``models/llamacpp.py``): ar and its own speculative decoding (sd, rule exact) on the GGUF files. docs/llamacpp.md."""
from .engine import Models, check

__all__ = ["Models", "check"]
