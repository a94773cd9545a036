//! Tokenizer built from GGUF metadata, and chat templates.
