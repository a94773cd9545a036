//! The `fast` rules of the split-attention forms (attention_pipe_fast.cu,
//! att_pipe_*, att_row_*): how many partials a row's keys are cut into
//! and which form a launch takes. Pure functions of the batch shape, the
//! device's occupancy and the tuning table, gathered by the planner
//! (planner.rs); tested here without a device. The tensor-core forms'
//! rules are in rmma.rs.

use super::geometry::{SplitForm, ATT_CLUSTER_MAX};
use crate::backend::cuda::device::memory::ATT_PARTS;
use crate::backend::cuda::tuning::{AttentionTuning, Switch};

/// Whether a unit's `ctas` CTAs may merge in a cluster: 2 to
/// ATT_CLUSTER_MAX of them (one takes att_pipe_m_, more than a cluster
/// holds take attention_combine), `t.cluster` on.
pub(super) fn cluster_rule(ctas: usize, t: &AttentionTuning) -> bool {
    t.cluster && (2..=ATT_CLUSTER_MAX).contains(&ctas)
}

/// Partials per row in `fast` mode, from `units` (rows x KV heads: the
/// split kernel's CTAs per partial) and `slots` (its CTAs resident on the
/// whole GPU at once, from the occupancy): all ATT_PARTS while they fit in
/// one wave; else the fewest partials whose CTAs fill their last wave to
/// at least 95% (or make 8 waves), so no wave runs mostly empty and each
/// CTA walks as many tiles as the GPU allows. A function of the batch
/// shape only, so a captured graph keeps its value. Measured on an H100
/// (bench-attn fast, 8B heads, att_pipe_d4_g4 at 3 CTAs per SM: 396
/// slots), us per call at ctx 512 / 2048 / 8192 for the partials this
/// picks vs the former rule (about 8 CTAs per SM): B=8 (6 vs 17 partials)
/// 12.3 / 34.6 / 101.9 vs 12.3 / 42.9 / 116.9; B=32 (3 vs 5) 37.1 /
/// 105.7 / 377.8 vs 41.5 / 116.5 / 403.2; B=64 (3, the same); B=1: 32.
pub(super) fn parts_for_slots(units: usize, slots: usize) -> usize {
    let (units, slots) = (units.max(1), slots.max(1));
    if units * ATT_PARTS <= slots {
        return ATT_PARTS;
    }
    // Share of the last wave's slots in use (1.0: whole waves).
    let fill = |p: usize| {
        let ctas = units * p;
        ctas as f64 / (ctas.div_ceil(slots) * slots) as f64
    };
    (1..=ATT_PARTS)
        .find(|&p| fill(p) >= 0.95 || units * p >= 8 * slots)
        .unwrap_or_else(|| {
            // No count fills its waves: the best fill (the fewest on a tie).
            (1..=ATT_PARTS).fold(1, |b, p| if fill(p) > fill(b) { p } else { b })
        })
}

/// Whether a launch of `ctas` CTAs of form `form` takes the bulk tensor
/// copies, `fits` saying it can (att_tma_fits): `t.tma` off never (every
/// lane's cp.async; the same bits either way), on wherever it fits, auto:
/// every launch but one kind, the partials kernel as a single wave of
/// more than two CTAs per SM (of its `slots` resident) whose CTAs fold
/// more than two chunks each (`chunks`: the longest row's, `parts` the
/// partials they are dealt to), where each lane's cp.async measured
/// faster. H100, bench-attn, 8B heads, 16-token pages, us per call with
/// PDL, bulk copies / cp.async: B=8 (384 CTAs of 396 slots, 6 partials)
/// ctx 2,048 (3 chunks a CTA) 33.4 / 32.3, ctx 8,192 100.9 / 98.4; but
/// ctx 1,024 (2 chunks) 16.5 / 19.0, B=1 (256 CTAs) ctx 8,192 17.5 /
/// 19.6, B=64 ctx 8,192 (1,536 CTAs) 736 / 760-800.
pub(super) fn tma_rule(
    form: SplitForm,
    (ctas, slots, sms): (usize, usize, usize),
    (chunks, parts): (usize, usize),
    fits: bool,
    t: &AttentionTuning,
) -> bool {
    fits && t.tma.or(form != SplitForm::Partials
        || ctas > slots
        || ctas <= 2 * sms
        || chunks.div_ceil(parts.max(1)) <= 2)
}

/// Whether `units` (row, KV head) pairs whose longest row has `part_ctas`
/// chunks (at most ATT_PARTS) fold each row in one CTA at ATT_M3_STAGES
/// stages (att_pipe_m3_*). Auto: rows of 2 to 16 chunks (a decode
/// graph's bucket fixes the count: up to 2,048 keys) and units that fill
/// the deep kernel's `deep_slots` resident CTAs by themselves (one
/// partial is what parts_for_slots would pick there). Measured on an
/// H100 (bench-attn, 8B heads, us per call with PDL; this form / the
/// 8-key split and its combine): B=32 ctx 512 29.8 / 33.3, ctx 2,048
/// 98.9 / 104.4; B=64 58.1 / 58.7, 197.3 / 203.3; but at ctx 8,192 385.4
/// / 378.6 and 741.5 / 734.6 (the split form stays there). On: rows of 2
/// to 16 chunks, whatever the batch.
pub(super) fn deep_rule(
    units: usize,
    part_ctas: usize,
    deep_slots: usize,
    t: &AttentionTuning,
) -> bool {
    let chunks = (2..=ATT_PARTS / 2).contains(&part_ctas);
    match t.deep {
        Switch::Off => false,
        Switch::On => chunks,
        Switch::Auto => chunks && parts_for_slots(units, deep_slots) == 1,
    }
}

/// Whether `units` (row, KV head) pairs whose longest row has `part_ctas`
/// 128-key chunks take the row form (att_row_*: one CTA per unit folds
/// the whole row, merges its warps in shared memory and writes the
/// output; no partials, combine or cluster), `sms` the device's SMs.
/// Auto: at most one unit per two SMs and rows of at most
/// `t.row_chunks_max` chunks. Measured on an H200 (bench-attn, us per
/// call with PDL at 64 / 128 keys, split forms / row form): B=1-8 faster
/// on every head shape (1B heads B=8 3.76 / 2.84, 4.09 / 3.61; 8B heads
/// 4.69 / 3.40, 5.06 / 4.48); at B=16 the 1B's 128 units (of 132 SMs)
/// slower (3.93 / 4.03, 4.30 / 4.93); past one chunk slower everywhere
/// (one SM folds about 128 keys per 1.5 us).
pub(super) fn row_rule(units: usize, part_ctas: usize, sms: usize, t: &AttentionTuning) -> bool {
    t.row.or(2 * units <= sms && part_ctas <= t.row_chunks_max)
}

/// Whether a launch of `ctas` CTAs in all takes the eight-warp form of
/// its partials, merging or cluster kernel (att_pipe8_*: each warp one
/// 16-key tile of a chunk instead of two), `sms` the device's SMs,
/// `per_sm` the eight-warp partials kernel's resident CTAs per SM. Auto:
/// launches of at most two CTAs per SM, where a CTA's warps are (nearly)
/// alone on their schedulers and the tile loop is latency-bound, and only
/// while the launch is one wave of the eight-warp kernel itself. Measured
/// on an H200: decode tg128@d512 SmolLM2 Q4_0 1,585-1,597 -> 1,616-1,624
/// tok/s, Llama-3.2-1B 1,616-1,635 -> 1,661-1,674, 8B Q4_0 487-490 ->
/// 493-495; bench-attn 8B heads B=1 ctx 512 / 2,048 / 8,192 7.43 / 8.41 /
/// 16.37 -> 6.33 / 7.51 / 15.67 us; but fuller launches lose (B=8 ctx 512
/// 9.13 -> 9.85, B=32 ctx 2,048 78.1 -> 89.9), and at head_dim 128 B=1
/// at 8,192 keys (8 x 32 CTAs, two waves at one CTA per SM) 19.45-19.51
/// against 15.42 in the four-warp form.
pub(super) fn eight_rule(ctas: usize, sms: usize, per_sm: usize, t: &AttentionTuning) -> bool {
    t.eight.or(ctas <= per_sm.min(2) * sms)
}

/// More than one CTA per (row, KV head): else the merging form runs.
fn several_ctas(parts: usize, part_ctas: usize) -> bool {
    part_ctas.min(parts) > 1
}

/// Whether `units` (row, KV head) pairs with `parts` partials each take
/// the 8-key-tile kernel (att_pipe_w_*). Auto: when the 16-key kernel's
/// grid would run in more than one wave of its `slots` resident CTAs,
/// each unit has more than one CTA (the merging form stays for one), and
/// rows reach at most 16 chunks (`part_ctas`, the longest row's, which a
/// decode graph's bucket fixes: 2,048 keys). There the smaller stages let
/// more CTAs share an SM, which short CTAs need. Measured on an H100
/// (bench-attn, 8B heads, us per call with PDL, 16-key / 8-key at 3
/// stages): B=64 ctx 512 66.8 / 52.6, ctx 2,048 207.4 / 194.1; B=32 35.1
/// / 32.6, 108.1 / 103.9; but at ctx 8,192 (32 chunks) 741.8 / 764.8 and
/// 381.4 / 383.2, and one-wave launches lose (B=1 ctx 512 8.9 / 10.0, B=8
/// 10.1 / 11.6). On: every launch of several CTAs per unit.
pub(super) fn wide_rule(
    units: usize,
    parts: usize,
    slots: usize,
    part_ctas: usize,
    t: &AttentionTuning,
) -> bool {
    let several = several_ctas(parts, part_ctas);
    match t.wide {
        Switch::Off => false,
        Switch::On => several,
        Switch::Auto => units * parts > slots && several && part_ctas <= ATT_PARTS / 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::tuning::Tuning;

    fn t() -> AttentionTuning {
        Tuning::for_arch("sm_90").attention
    }

    #[test]
    fn cluster_form_for_two_to_sixteen_ctas_per_unit() {
        // One CTA merges its own partials (att_pipe_m_); past an H100's
        // largest cluster attention_combine merges.
        for (c, want) in [(0, false), (1, false), (2, true), (5, true)] {
            assert_eq!(cluster_rule(c, &t()), want, "{c}");
        }
        assert!(cluster_rule(8, &t()) && cluster_rule(16, &t()));
        assert!(!cluster_rule(17, &t()) && !cluster_rule(32, &t()));
        let off = AttentionTuning {
            cluster: false,
            ..t()
        };
        assert!(!cluster_rule(5, &off));
    }

    #[test]
    fn deep_form_for_rows_of_two_to_sixteen_chunks_that_fill_the_gpu() {
        // An H100's 132 SMs at 2 deep CTAs per SM: 264 slots.
        let slots = 264;
        // B=32 and B=64 of 8 KV heads at 512 and 2,048 keys.
        for units in [256, 512] {
            for chunks in [4, 16] {
                assert!(deep_rule(units, chunks, slots, &t()), "{units} {chunks}");
            }
            // One chunk (the plain merging form) and past 16 chunks (the
            // split form) stay.
            assert!(!deep_rule(units, 1, slots, &t()));
            assert!(!deep_rule(units, 17, slots, &t()));
            assert!(!deep_rule(units, 32, slots, &t()));
        }
        // Too few units to fill a wave: B=8 and B=16; unless forced on.
        assert!(!deep_rule(64, 16, slots, &t()));
        assert!(!deep_rule(128, 16, slots, &t()));
        let on = AttentionTuning {
            deep: Switch::On,
            ..t()
        };
        assert!(deep_rule(64, 16, slots, &on));
        assert!(!deep_rule(64, 1, slots, &on));
    }

    #[test]
    fn bulk_copies_except_one_full_wave_of_long_partials() {
        let (slots, sms) = (396, 132);
        let rule =
            |f, ctas, chunks, parts| tma_rule(f, (ctas, slots, sms), (chunks, parts), true, &t());
        // B=8: 384 CTAs in one wave of 396 slots, 6 partials of rows of
        // 16 and 32 chunks (2,048 and 8,192 keys).
        assert!(!rule(SplitForm::Partials, 384, 16, 6));
        assert!(!rule(SplitForm::Partials, 384, 32, 6));
        // The same launch over 8 chunks (1,024 keys): two a CTA.
        assert!(rule(SplitForm::Partials, 384, 8, 6));
        // B=1 (256 CTAs) and multi-wave launches.
        assert!(rule(SplitForm::Partials, 256, 32, 32));
        assert!(rule(SplitForm::Partials, 768, 32, 3));
        // Every other form.
        for f in [
            SplitForm::Merge,
            SplitForm::Wide,
            SplitForm::Cluster,
            SplitForm::Deep,
        ] {
            assert!(rule(f, 384, 16, 6));
        }
        // Never where it does not fit; never when switched off.
        assert!(!tma_rule(
            SplitForm::Merge,
            (384, slots, sms),
            (16, 6),
            false,
            &t()
        ));
        let off = AttentionTuning {
            tma: Switch::Off,
            ..t()
        };
        assert!(!tma_rule(
            SplitForm::Merge,
            (384, slots, sms),
            (16, 6),
            true,
            &off
        ));
    }

    #[test]
    fn fast_parts_fill_the_last_wave() {
        // Llama-3.1-8B (8 KV heads) on 132 SMs at 3 CTAs per SM.
        let parts = |units| parts_for_slots(units, 396);
        // B=1: 8 x 32 CTAs fit in one wave.
        assert_eq!(parts(8), 32);
        // B=8: 6 x 64 = 384 of 396 slots; 1..5 leave the wave emptier.
        assert_eq!(parts(8 * 8), 6);
        // B=32: 3 x 256 = 768 of 792 (two waves); 1 and 2 fill 65%.
        assert_eq!(parts(32 * 8), 3);
        // B=64: 1 fills 65% of 2 waves, 2 86% of 3, 3 97% of 4.
        assert_eq!(parts(64 * 8), 3);
        // 8 waves or more with one partial.
        assert_eq!(parts(10_000), 1);
        assert_eq!(parts(0), 32);
        // One slot: any count fills it.
        assert_eq!(parts_for_slots(5, 1), 1);
    }

    #[test]
    fn wide_form_only_past_one_wave_with_several_ctas_per_unit() {
        // Llama-3.1-8B on 132 SMs at 3 CTAs per SM (396 slots), the
        // partials parts_for_slots picks.
        let wide = |b: usize, part_ctas| {
            let units = 8 * b;
            wide_rule(units, parts_for_slots(units, 396), 396, part_ctas, &t())
        };
        // B=1 (8 x 32 = 256 CTAs) and B=8 (64 x 6 = 384): one wave.
        assert!(!wide(1, 64));
        assert!(!wide(8, 64));
        // B=32 (256 x 3 = 768) and B=64 (512 x 3): more than one.
        assert!(wide(32, 4));
        assert!(wide(64, 8));
        // Contexts of at most 128 keys: one CTA per unit (the merging form).
        assert!(!wide(64, 1));
        // Past 16 chunks (2,048 keys) per row: the 16-key form.
        assert!(wide(64, 16));
        assert!(!wide(64, 17));
        assert!(!wide(32, 32));
        // Many units with one partial each but more than one wave.
        assert!(wide_rule(1000, 2, 396, 2, &t()));
        assert!(!wide_rule(1000, 1, 396, 4, &t()));
    }

    #[test]
    fn eight_warp_forms_for_launches_of_few_ctas() {
        // Batch 1 on 132 SMs: SmolLM2 (3 KV heads, head_dim 64: three
        // eight-warp CTAs per SM) at up to 2,048 keys (16 chunks) and the
        // 8B (8, head_dim 128: one per SM) at up to 2,048; not the 8B at
        // 8,192 (32 partials: two waves of the eight-warp form), which
        // head_dim 64's two per SM would take.
        assert!(eight_rule(3 * 16, 132, 3, &t()));
        assert!(eight_rule(8 * 16, 132, 1, &t()));
        assert!(!eight_rule(8 * 32, 132, 1, &t()));
        assert!(eight_rule(8 * 32, 132, 3, &t()));
        // Batch 8 of the 8B at 512 keys (6 partials: 384 CTAs) and more.
        assert!(!eight_rule(64 * 6, 132, 2, &t()));
        assert!(!eight_rule(256 * 3, 132, 2, &t()));
    }

    #[test]
    fn row_form_for_few_units_of_one_chunk() {
        // Batch 1 on 132 SMs: SmolLM2 (3 KV heads), the 1B and 8B (8)
        // while a row has at most 128 keys (one chunk); not at 512 keys
        // (5 chunks), where one SM's copies and arithmetic for the whole
        // row lose to the split forms by 20-25% of a decode step.
        assert!(row_rule(3, 1, 132, &t()));
        assert!(row_rule(8, 1, 132, &t()));
        assert!(!row_rule(8, 5, 132, &t()));
        assert!(!row_rule(3, 2, 132, &t()));
        // B=8 of 8 KV heads (64 units) still; B=16 (128 units) not.
        assert!(row_rule(64, 1, 132, &t()));
        assert!(!row_rule(128, 1, 132, &t()));
        assert!(!row_rule(133, 1, 132, &t()));
    }
}
