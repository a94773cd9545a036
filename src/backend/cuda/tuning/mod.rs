//! The tuning table: every choice of the CUDA backend that is a number or a
//! switch rather than a consequence of the op (thresholds between kernel
//! forms, tile sizes, pipeline depths, feature switches).
//!
//! One [`Tuning`] per device architecture ([`Tuning::for_arch`]), built once
//! when the backend opens the device and passed explicitly to every planner
//! (`plan(shape, mode, caps, &tuning) -> Plan`). It is never read from the
//! environment: a file (`--tuning FILE`, JSON) or code ([`TuningOverrides`])
//! overlays the architecture's defaults, so a sweep runs in one process by
//! building one backend per setting.
//!
//! No field changes a bit of `exact` or `deterministic` output: planners
//! consult it only where the choice leaves a row's reduction order alone
//! (docs/DETERMINISM.md), and the planner table tests assert that.
//!
//! One sub-table per op family, each in its own file next to this one.

mod attention;
mod gdn;
mod matmul;
mod matvec;
mod runtime;

pub use attention::{AttentionTuning, AttnFamily};
pub use gdn::GdnTuning;
pub use matmul::{GluForm, MatmulTuning, WrShape};
pub use matvec::MatvecTuning;
pub use runtime::RuntimeTuning;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The whole table. Field names are the keys of a tuning file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tuning {
    /// Prefill and batched-decode GEMMs (cuBLAS, wgmma, int8 / f16 MMA).
    pub matmul: MatmulTuning,
    /// One-row decode matvecs, their fused epilogues and the L2 read-ahead.
    pub matvec: MatvecTuning,
    /// Paged attention (decode split-KV, row forms, prefill).
    pub attention: AttentionTuning,
    /// The hybrid (Gated DeltaNet) ops' state paths.
    pub gdn: GdnTuning,
    /// Graphs, programmatic launch, on-device sampling.
    pub runtime: RuntimeTuning,
}

/// Compute capability major version of an `sm_XY` architecture name
/// (`sm_90` -> 9, `sm_120` -> 12); 0 when the name is not of that form.
pub fn arch_major(arch: &str) -> u32 {
    let digits = arch.trim_start_matches("sm_").trim_end_matches('a');
    match digits.len() {
        0 | 1 => 0,
        n => digits[..n - 1].parse().unwrap_or(0),
    }
}

impl Tuning {
    /// The defaults for a device architecture (`sm_80`, `sm_90`, ...).
    pub fn for_arch(arch: &str) -> Tuning {
        let major = arch_major(arch);
        Tuning {
            matmul: MatmulTuning::for_arch(major),
            matvec: MatvecTuning::for_arch(major),
            attention: AttentionTuning::for_arch(major),
            gdn: GdnTuning::for_arch(major),
            runtime: RuntimeTuning::for_arch(major),
        }
    }

    /// The defaults of `arch` with `overrides` laid over them.
    pub fn resolve(arch: &str, overrides: &TuningOverrides) -> Result<Tuning> {
        let base = Tuning::for_arch(arch);
        let Some(over) = &overrides.0 else {
            return Ok(base);
        };
        let mut v = serde_json::to_value(&base).context("serializing the tuning defaults")?;
        overlay(&mut v, over, "")?;
        serde_json::from_value(v).context("the tuning overrides")
    }
}

/// Overrides of the tuning table: a partial JSON object of [`Tuning`]'s
/// shape, e.g. `{"matvec": {"norm_ahead": "on"}}`. Unknown keys are errors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TuningOverrides(Option<serde_json::Value>);

impl TuningOverrides {
    /// No overrides: the architecture's defaults.
    pub fn none() -> Self {
        TuningOverrides(None)
    }

    /// Overrides from JSON text.
    pub fn from_json(text: &str) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_str(text).context("tuning: invalid JSON")?;
        if !v.is_object() {
            bail!("tuning: expected a JSON object of tables, e.g. {{\"matvec\": {{...}}}}");
        }
        Ok(TuningOverrides(Some(v)))
    }

    /// Overrides from a JSON file (`--tuning FILE`).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the tuning file {}", path.display()))?;
        Self::from_json(&text).with_context(|| format!("tuning file {}", path.display()))
    }

    /// These overrides with `more` laid over them (later wins).
    pub fn and(mut self, more: &TuningOverrides) -> Result<Self> {
        match (&mut self.0, &more.0) {
            (_, None) => {}
            (None, Some(m)) => self.0 = Some(m.clone()),
            (Some(a), Some(m)) => merge_json(a, m),
        }
        Ok(self)
    }

    /// One override by dotted path, e.g. `set("matvec.norm_ahead", "on")`;
    /// `value` is parsed as JSON, or taken as a string when it is not JSON.
    pub fn set(self, path: &str, value: &str) -> Result<Self> {
        let parsed = serde_json::from_str(value)
            .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
        let keys: Vec<&str> = path.split('.').collect();
        if keys.iter().any(|k| k.is_empty()) {
            bail!("tuning: bad key path {path:?}");
        }
        // Built from the leaf outwards: {"a": {"b": value}}.
        let node = keys.iter().rev().fold(parsed, |inner, k| {
            let mut obj = serde_json::Map::new();
            obj.insert(k.to_string(), inner);
            serde_json::Value::Object(obj)
        });
        self.and(&TuningOverrides(Some(node)))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

/// Lays `over` onto `base`; keys of `over` that `base` lacks are errors
/// (a misspelt knob must not pass silently).
fn overlay(base: &mut serde_json::Value, over: &serde_json::Value, at: &str) -> Result<()> {
    match (base, over) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                let path = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                match b.get_mut(k) {
                    Some(slot) => overlay(slot, v, &path)?,
                    None => {
                        let known: Vec<&str> = b.keys().map(|s| s.as_str()).collect();
                        bail!(
                            "tuning: unknown key {path:?} (known here: {})",
                            known.join(", ")
                        )
                    }
                }
            }
            Ok(())
        }
        (b, o) => {
            *b = o.clone();
            Ok(())
        }
    }
}

fn merge_json(a: &mut serde_json::Value, b: &serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(slot) => merge_json(slot, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (a, b) => *a = b.clone(),
    }
}

/// A three-way switch of the tuning table: forced on, forced off, or left
/// to the planner's rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    #[default]
    Auto,
    On,
    Off,
}

impl Switch {
    /// The switch's answer, or `rule` when it is `Auto`.
    pub fn or(self, rule: bool) -> bool {
        match self {
            Switch::Auto => rule,
            Switch::On => true,
            Switch::Off => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_major_of_names() {
        for (a, m) in [
            ("sm_80", 8),
            ("sm_90", 9),
            ("sm_90a", 9),
            ("sm_120", 12),
            ("x", 0),
        ] {
            assert_eq!(arch_major(a), m, "{a}");
        }
    }

    #[test]
    fn no_overrides_is_the_defaults() {
        let t = Tuning::resolve("sm_90", &TuningOverrides::none()).unwrap();
        assert_eq!(t, Tuning::for_arch("sm_90"));
    }

    #[test]
    fn defaults_round_trip_through_a_file() {
        for arch in ["sm_80", "sm_89", "sm_90", "sm_100"] {
            let t = Tuning::for_arch(arch);
            let text = serde_json::to_string_pretty(&t).unwrap();
            let back = Tuning::resolve(arch, &TuningOverrides::from_json(&text).unwrap()).unwrap();
            assert_eq!(back, t, "{arch}");
        }
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let o = TuningOverrides::from_json(r#"{"matvec": {"no_such_knob": 1}}"#).unwrap();
        let e = Tuning::resolve("sm_90", &o).unwrap_err();
        assert!(format!("{e:#}").contains("matvec.no_such_knob"), "{e:#}");
        let o = TuningOverrides::from_json(r#"{"nope": {}}"#).unwrap();
        assert!(Tuning::resolve("sm_90", &o).is_err());
        assert!(TuningOverrides::from_json("[1]").is_err());
        assert!(TuningOverrides::none().set("a..b", "1").is_err());
    }

    #[test]
    fn a_wrong_type_is_an_error() {
        let o = TuningOverrides::none()
            .set("runtime.graphs", "\"maybe\"")
            .unwrap();
        assert!(Tuning::resolve("sm_90", &o).is_err());
    }

    #[test]
    fn set_overrides_one_field_and_later_wins() {
        let o = TuningOverrides::none()
            .set("runtime.graphs", "false")
            .unwrap()
            .set("runtime.graphs", "true")
            .unwrap()
            .set("runtime.pdl", "false")
            .unwrap();
        let t = Tuning::resolve("sm_90", &o).unwrap();
        let mut want = Tuning::for_arch("sm_90");
        want.runtime.graphs = true;
        want.runtime.pdl = false;
        assert_eq!(t, want);
    }

    #[test]
    fn switch_or_rule() {
        assert!(Switch::Auto.or(true) && !Switch::Auto.or(false));
        assert!(Switch::On.or(false) && !Switch::Off.or(true));
    }
}
