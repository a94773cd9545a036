//! Per-op backend choice. Asks each backend, in priority order, whether it
//! supports the op in the current mode; never compares backend names.
//! Records which backend ran each op kind, for `--show-backends`.

use crate::backend::{Backend, Mode, Op};
use anyhow::{anyhow, Context, Result};
use std::collections::BTreeMap;
use std::sync::Mutex;

pub struct Dispatcher {
    backends: Vec<Box<dyn Backend>>,
    mode: Mode,
    /// (op kind, backend name) -> count.
    counts: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl Dispatcher {
    /// `backends` in priority order; the last should support everything
    /// (the CPU reference).
    pub fn new(backends: Vec<Box<dyn Backend>>, mode: Mode) -> Self {
        Dispatcher {
            backends,
            mode,
            counts: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn run(&self, op: Op<'_>) -> Result<()> {
        let kind = op.kind();
        let b = self
            .backends
            .iter()
            .find(|b| b.supports_op(&op, self.mode))
            .ok_or_else(|| anyhow!("no backend supports op {kind} in mode {:?}", self.mode))?;
        let name = b.name();
        b.run(op, self.mode)
            .with_context(|| format!("op {kind} on backend {name}"))?;
        if let Ok(mut c) = self.counts.lock() {
            *c.entry((kind, name)).or_insert(0) += 1;
        }
        Ok(())
    }

    /// Which backend ran each op kind, and how often.
    pub fn report(&self) -> Vec<(String, String, u64)> {
        self.counts
            .lock()
            .map(|c| {
                c.iter()
                    .map(|((k, b), n)| (k.to_string(), b.to_string(), *n))
                    .collect()
            })
            .unwrap_or_default()
    }
}
