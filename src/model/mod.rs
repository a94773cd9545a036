//! Model graphs built from GGUF weights.
