//! The reference CPU backend: deterministic, batch-invariant, multi-threaded.
