//! Paged KV cache bookkeeping: block pool and per-sequence block tables (pure, no device).
