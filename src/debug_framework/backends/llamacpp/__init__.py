"""llama.cpp, through the C API of the xllamacpp wheel (docs/gguf.md)."""
