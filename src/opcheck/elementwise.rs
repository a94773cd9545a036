//! Parity cases of the elementwise ops (rms_norm, add, swiglu, rope, ...):
//! random rows with special values mixed in, against the cpu reference.

use super::*;

impl Ctx<'_> {
    pub(super) fn elementwise(&mut self) {
        let mode = self.opts.mode;
        let lens: &[usize] = if self.opts.quick {
            &[1, 31, 1000]
        } else {
            &[1, 31, 1000, 100_003, 1 << 20]
        };
        if self.want("rms_norm") {
            for &(n, dim, special) in &[
                (1usize, 1usize, false),
                (3, 33, false),
                (5, 576, false),
                (2, 2048, false),
                (3, 4096, false),
                (7, 4097, false),
                (9, 576, true),
                // Past 48 KiB of shared memory: the cuda warp-per-row kernel.
                (2, 12289, false),
            ] {
                let mut x = randv(&mut self.rng, n * dim, 3.0);
                if special {
                    specials(&mut self.rng, &mut x, self.opts.mode == Mode::Exact, true);
                }
                let w = randv(&mut self.rng, dim, 1.5);
                let mut r = vec![0f32; n * dim];
                let mut y = Guarded::new(n * dim);
                let mut tmp = vec![0f32; n * dim];
                let (sup, err, t) = run_case!(self, mode, y, r, time tmp, |out| Op::RmsNorm {
                    x: &x,
                    w: &w,
                    dim,
                    eps: 1e-5,
                    out,
                });
                let perf = t.map(|t| (t, (8 * n * dim + 4 * dim) as f64, (3 * n * dim) as f64));
                let g = y.guards_ok();
                self.finish(
                    "rms_norm",
                    format!("n={n} dim={dim}{}", if special { " specials" } else { "" }),
                    sup,
                    err,
                    y.body(),
                    &r,
                    g,
                    perf,
                );
            }
        }
        if self.want("swiglu") {
            let cases: Vec<(usize, bool)> = lens
                .iter()
                .map(|&l| (l, false))
                .chain([(1000, true)])
                .collect();
            for (len, special) in cases {
                // Wide range: exercises exp's overflow/underflow branches.
                let mut gate = randv(&mut self.rng, len, 120.0);
                let mut up = randv(&mut self.rng, len, 2.0);
                if special {
                    specials(
                        &mut self.rng,
                        &mut gate,
                        self.opts.mode == Mode::Exact,
                        true,
                    );
                    specials(&mut self.rng, &mut up, self.opts.mode == Mode::Exact, true);
                }
                let mut r = vec![0f32; len];
                let mut y = Guarded::new(len);
                let mut tmp = vec![0f32; len];
                let (sup, err, t) = run_case!(self, mode, y, r, time tmp, |out| Op::SwiGlu {
                    gate: &gate,
                    up: &up,
                    out,
                });
                let perf = t.map(|t| (t, (12 * len) as f64, (20 * len) as f64));
                let g = y.guards_ok();
                self.finish(
                    "swiglu",
                    format!("len={len}{}", if special { " specials" } else { "" }),
                    sup,
                    err,
                    y.body(),
                    &r,
                    g,
                    perf,
                );
            }
        }
        if self.want("add") {
            for &len in lens {
                let x0 = randv(&mut self.rng, len, 10.0);
                let yv = randv(&mut self.rng, len, 10.0);
                let mut r = x0.clone();
                let mut y = Guarded::from(&x0);
                let mut tmp = x0.clone();
                let (sup, err, t) =
                    run_case!(self, mode, y, r, time tmp, |x| Op::Add { x, y: &yv });
                let perf = t.map(|t| (t, (12 * len) as f64, len as f64));
                let g = y.guards_ok();
                self.finish("add", format!("len={len}"), sup, err, y.body(), &r, g, perf);
            }
            for &(n, dim) in &[(1usize, 1usize), (3, 33), (17, 576), (64, 2048)] {
                let x0 = randv(&mut self.rng, n * dim, 10.0);
                let bias = randv(&mut self.rng, dim, 10.0);
                let mut r = x0.clone();
                let mut y = Guarded::from(&x0);
                let (sup, err, _) = run_case!(self, mode, y, r, |x| Op::AddBias { x, bias: &bias });
                let g = y.guards_ok();
                self.finish(
                    "add_bias",
                    format!("n={n} dim={dim}"),
                    sup,
                    err,
                    y.body(),
                    &r,
                    g,
                    None,
                );
            }
        }
        if self.want("rope") {
            for &(n, nh, hd, rd, neox) in &[
                (1usize, 1usize, 64usize, 64usize, false),
                (3, 3, 64, 64, true),
                (5, 9, 80, 80, false),
                (7, 4, 128, 128, true),
                (2, 2, 256, 256, false),
                (4, 3, 128, 32, true),
                (33, 8, 64, 64, false),
            ] {
                let x0 = randv(&mut self.rng, n * nh * hd, 4.0);
                let positions: Vec<u32> =
                    (0..n).map(|_| self.rng.random_range(0..40_000)).collect();
                let inv_freq: Vec<f32> = (0..rd / 2)
                    .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / rd as f32))
                    .collect();
                let mut r = x0.clone();
                let mut y = Guarded::from(&x0);
                let (sup, err, _) = run_case!(self, mode, y, r, |x| Op::Rope {
                    x,
                    n_heads: nh,
                    head_dim: hd,
                    rope_dim: rd,
                    positions: &positions,
                    inv_freq: &inv_freq,
                    neox,
                });
                let g = y.guards_ok();
                self.finish(
                    "rope",
                    format!("n={n} heads={nh} hd={hd} rope={rd} neox={neox}"),
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
}
