//! Parity cases of `select_rows` (a copy: bitwise in every mode).

use super::{randv, Ctx, Guarded};
use crate::backend::Op;
use rand::Rng;

impl Ctx<'_> {
    pub(super) fn select_rows(&mut self) {
        if !self.want("select_rows") {
            return;
        }
        let mode = self.opts.mode;
        for &(n, dim, m) in &[
            (1usize, 64usize, 1usize),
            (7, 576, 3),
            (512, 2048, 5),
            (33, 77, 33),
        ] {
            let x = randv(&mut self.rng, n * dim, 2.0);
            // Any rows, repeats allowed, in any order.
            let rows: Vec<u32> = (0..m).map(|_| self.rng.random_range(0..n as u32)).collect();
            let mut r = vec![0f32; m * dim];
            let mut y = Guarded::new(m * dim);
            let sup = self.be.supports_op(
                &Op::SelectRows {
                    x: &x,
                    dim,
                    rows: &rows,
                    out: y.body_mut(),
                },
                mode,
            );
            let mut err = None;
            if sup {
                if let Err(e) = self.cpu.run(
                    Op::SelectRows {
                        x: &x,
                        dim,
                        rows: &rows,
                        out: &mut r,
                    },
                    mode,
                ) {
                    err = Some(format!("cpu reference: {e:#}"));
                } else if let Err(e) = self.be.run(
                    Op::SelectRows {
                        x: &x,
                        dim,
                        rows: &rows,
                        out: y.body_mut(),
                    },
                    mode,
                ) {
                    err = Some(format!("{e:#}"));
                }
            }
            let g = y.guards_ok();
            self.finish(
                "select_rows",
                format!("n={n} dim={dim} rows={m}"),
                sup,
                err,
                y.body(),
                &r,
                g,
                None,
            );
        }
    }
}
