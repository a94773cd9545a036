//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty; seeded per request.
