"""The engine interface, the reference engine and the adapters for vLLM and SGLang."""
