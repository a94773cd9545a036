//! GGUF target: structure-aware mutations of small valid models, each run
//! through the load path of `quire run` (open, config, weights on the cpu
//! backend, tokenizer) and, when that succeeds, one tokenize + one decode
//! step. A panic fails the case; an error must carry a short, non-empty
//! message.

use super::gguf_raw::{RawGguf, RawKv, RawStr, RawVal, T_ARRAY, T_STRING};
use proptest::prelude::*;
use proptest::sample::Index;
use quire::engine::{generate, GenerateOptions};
use quire::gguf::GgufFile;
use quire::kv::SeqId;
use quire::model::synth::{write_model, SynthShape};
use quire::quant::GgmlType;
use quire::runner::{Runner, RunnerOptions};
use quire::sampler::SamplingParams;
use quire::tokenizer::{ChatMessage, Tokenizer};
use std::path::Path;
use std::sync::OnceLock;

/// Longest error message accepted: enough for a context chain naming the
/// file, the key and the values; a message echoing a whole string table or
/// tensor list would blow it.
pub const MAX_ERROR_LEN: usize = 4096;

fn tiny_shape(arch: &'static str, vocab: usize, tied: bool) -> SynthShape {
    SynthShape {
        name: "fuzz",
        arch,
        n_layers: 1,
        dim: 32,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 16,
        ffn_dim: 64,
        vocab,
        context_length: 256,
        rope_base: 10000.0,
        tied,
        gdn: None,
    }
}

/// The seeds mutations start from: a tied llama (Q8_0), an untied qwen3
/// (Q4_1), and a tied llama carrying the default model's tokenizer and
/// general metadata (its 49k-token vocabulary, merges and chat template),
/// when the default model is available.
pub fn bases() -> &'static [RawGguf] {
    static B: OnceLock<Vec<RawGguf>> = OnceLock::new();
    B.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut out = Vec::new();
        let synth = |name: &str, s: &SynthShape, ty: GgmlType| -> RawGguf {
            let p = dir.path().join(name);
            write_model(&p, s, ty, 7).expect("writing a seed model");
            RawGguf::from_file(&GgufFile::open(&p).expect("opening a seed model"))
        };
        out.push(synth(
            "a.gguf",
            &tiny_shape("llama", 300, true),
            GgmlType::Q8_0,
        ));
        out.push(synth(
            "b.gguf",
            &tiny_shape("qwen3", 300, false),
            GgmlType::Q4_1,
        ));
        match quire::fetch::default_model_path() {
            Ok(p) => {
                let real = GgufFile::open(&p).expect("opening the default model");
                let n_vocab = real
                    .get_str_array("tokenizer.ggml.tokens")
                    .expect("default model tokens")
                    .len();
                let mut c = synth(
                    "c.gguf",
                    &tiny_shape("llama", n_vocab, true),
                    GgmlType::Q8_0,
                );
                let borrowed: Vec<RawKv> = RawGguf::from_file(&real)
                    .kvs
                    .into_iter()
                    .filter(|kv| {
                        let k = String::from_utf8_lossy(&kv.key.bytes).to_string();
                        (k.starts_with("tokenizer.") || k.starts_with("general."))
                            && k != "general.alignment"
                            && k != "general.architecture"
                    })
                    .collect();
                c.kvs.retain(|kv| {
                    !kv.key.bytes.starts_with(b"tokenizer.")
                        && !borrowed.iter().any(|b| b.key.bytes == kv.key.bytes)
                });
                c.kvs.extend(borrowed);
                out.push(c);
            }
            Err(e) => eprintln!(
                "fuzz gguf: the default model is unavailable ({e:#}); synthetic seeds only"
            ),
        }
        // The seeds themselves must load: otherwise every case is an error
        // and the fuzzer tests nothing past the first check.
        for (i, b) in out.iter().enumerate() {
            let p = dir.path().join("check.gguf");
            std::fs::write(&p, b.to_bytes().bytes).unwrap();
            if let Err(e) = load_and_use(&p) {
                panic!("seed {i} does not load: {e:#}");
            }
        }
        out
    })
}

/// A count or length: nudged, or set to an edge value.
#[derive(Clone, Debug)]
pub enum CountEdit {
    Delta(i8),
    Set(u64),
}

fn count_edit() -> impl Strategy<Value = CountEdit> {
    prop_oneof![
        (-3i8..=3).prop_map(CountEdit::Delta),
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(u32::MAX as u64),
            Just(1 << 32),
            Just(1 << 40),
            Just(1 << 62),
            Just(u64::MAX),
            Just(u64::MAX - 7),
            any::<u16>().prop_map(u64::from),
        ]
        .prop_map(CountEdit::Set),
    ]
}

impl CountEdit {
    fn apply(&self, n: u64) -> u64 {
        match self {
            CountEdit::Delta(d) => n.wrapping_add(*d as i64 as u64),
            CountEdit::Set(v) => *v,
        }
    }
}

/// A metadata value to store.
#[derive(Clone, Debug)]
pub enum Val {
    Int {
        ty: u32,
        v: i128,
    },
    Float {
        double: bool,
        v: f64,
    },
    Bool(u8),
    Str(Vec<u8>),
    StrArr(Vec<Vec<u8>>),
    IntArr {
        ty: u32,
        v: Vec<i128>,
    },
    FloatArr(Vec<f32>),
    /// An array of arrays (GGUF allows it; no key expects it).
    Nested,
    EmptyArr {
        elem_ty: u32,
    },
}

fn edge_int() -> impl Strategy<Value = i128> {
    prop_oneof![
        Just(0i128),
        Just(1),
        Just(-1),
        Just(2),
        Just(3),
        Just(16),
        Just(i32::MAX as i128),
        Just(i32::MIN as i128),
        Just(u32::MAX as i128),
        Just(1 << 32),
        Just(i64::MAX as i128),
        Just(u64::MAX as i128),
        (0i128..400),
        any::<i64>().prop_map(i128::from),
    ]
}

fn edge_float() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-1.0),
        Just(0.0),
        Just(-0.0),
        Just(1e-45),
        Just(1e-6),
        Just(1e30),
        Just(1e300),
        any::<f64>(),
    ]
}

fn edge_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        Just(b"llama".to_vec()),
        Just(b"qwen2".to_vec()),
        Just(b"qwen3".to_vec()),
        Just(b"gpt2".to_vec()),
        Just(b"llama".to_vec()),
        Just(b"smollm".to_vec()),
        Just(b"default".to_vec()),
        Just(b"<|im_start|>".to_vec()),
        Just(b"\0".to_vec()),
        Just(vec![0xff, 0xfe, 0x80]),
        Just(b"{% for m in messages %}{{ m.content }}{% endfor %}".to_vec()),
        Just(vec![b'a'; 1000]),
        proptest::collection::vec(any::<u8>(), 0..24),
    ]
}

const INT_TYPES: [u32; 8] = [0, 1, 2, 3, 4, 5, 10, 11];

fn val() -> impl Strategy<Value = Val> {
    prop_oneof![
        3 => (proptest::sample::select(&INT_TYPES[..]), edge_int()).prop_map(|(ty, v)| Val::Int { ty, v }),
        2 => (any::<bool>(), edge_float()).prop_map(|(double, v)| Val::Float { double, v }),
        1 => prop_oneof![Just(0u8), Just(1), Just(2), Just(255)].prop_map(Val::Bool),
        2 => edge_bytes().prop_map(Val::Str),
        1 => proptest::collection::vec(edge_bytes(), 0..6).prop_map(Val::StrArr),
        1 => (proptest::sample::select(&INT_TYPES[..]), proptest::collection::vec(edge_int(), 0..6))
            .prop_map(|(ty, v)| Val::IntArr { ty, v }),
        1 => proptest::collection::vec(edge_float().prop_map(|f| f as f32), 0..6).prop_map(Val::FloatArr),
        1 => Just(Val::Nested),
        1 => prop_oneof![Just(0u32), Just(4), Just(6), Just(8), Just(9), Just(13), Just(u32::MAX)]
            .prop_map(|elem_ty| Val::EmptyArr { elem_ty }),
    ]
}

fn int_width(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        _ => 8,
    }
}

fn int_raw(ty: u32, v: i128) -> RawVal {
    RawVal::Scalar {
        ty,
        bytes: v.to_le_bytes()[..int_width(ty)].to_vec(),
    }
}

impl Val {
    fn raw(&self) -> RawVal {
        match self {
            Val::Int { ty, v } => int_raw(*ty, *v),
            Val::Float { double: true, v } => RawVal::Scalar {
                ty: 12,
                bytes: v.to_le_bytes().to_vec(),
            },
            Val::Float { double: false, v } => RawVal::Scalar {
                ty: 6,
                bytes: (*v as f32).to_le_bytes().to_vec(),
            },
            Val::Bool(b) => RawVal::Scalar {
                ty: 7,
                bytes: vec![*b],
            },
            Val::Str(s) => RawVal::Str(RawStr::new(s.clone())),
            Val::StrArr(v) => RawVal::Array {
                elem_ty: T_STRING,
                len_override: None,
                items: v
                    .iter()
                    .map(|s| RawVal::Str(RawStr::new(s.clone())))
                    .collect(),
            },
            Val::IntArr { ty, v } => RawVal::Array {
                elem_ty: *ty,
                len_override: None,
                items: v.iter().map(|x| int_raw(*ty, *x)).collect(),
            },
            Val::FloatArr(v) => RawVal::Array {
                elem_ty: 6,
                len_override: None,
                items: v
                    .iter()
                    .map(|f| RawVal::Scalar {
                        ty: 6,
                        bytes: f.to_le_bytes().to_vec(),
                    })
                    .collect(),
            },
            Val::Nested => RawVal::Array {
                elem_ty: T_ARRAY,
                len_override: None,
                items: vec![Val::IntArr {
                    ty: 4,
                    v: vec![1, 2],
                }
                .raw()],
            },
            Val::EmptyArr { elem_ty } => RawVal::Array {
                elem_ty: *elem_ty,
                len_override: None,
                items: Vec::new(),
            },
        }
    }
}

/// Keys the loader reads; `{a}` is replaced by the file's architecture.
const KEYS: &[&str] = &[
    "general.alignment",
    "general.architecture",
    "{a}.block_count",
    "{a}.context_length",
    "{a}.embedding_length",
    "{a}.feed_forward_length",
    "{a}.attention.head_count",
    "{a}.attention.head_count_kv",
    "{a}.attention.key_length",
    "{a}.attention.value_length",
    "{a}.attention.layer_norm_rms_epsilon",
    "{a}.rope.freq_base",
    "{a}.rope.dimension_count",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
];

/// One structural edit; indices resolve against the file being mutated.
#[derive(Clone, Debug)]
pub enum Mut {
    Magic([u8; 4]),
    Version(u32),
    TensorCount(CountEdit),
    KvCount(CountEdit),
    /// Store `val` under a key the loader reads (replacing or adding it).
    SetKey {
        key: Index,
        val: Val,
    },
    /// Numeric edge value in the value's own type (a no-op on others).
    Edge {
        kv: Index,
        int: i128,
        float: f64,
    },
    KvType {
        kv: Index,
        ty: u32,
    },
    KvDelete(Index),
    KvDup(Index),
    KvRename {
        kv: Index,
        to: Index,
    },
    /// The declared length of a key, string value, string element or
    /// tensor name.
    StrLen {
        target: Index,
        item: Index,
        edit: CountEdit,
    },
    ArrLen {
        kv: Index,
        edit: CountEdit,
    },
    ArrElemType {
        kv: Index,
        ty: u32,
    },
    ArrKeep {
        kv: Index,
        keep: Index,
    },
    TensorNDims {
        t: Index,
        n: u32,
    },
    TensorDim {
        t: Index,
        d: Index,
        v: CountEdit,
    },
    TensorDimsPushPop {
        t: Index,
        push: bool,
    },
    TensorType {
        t: Index,
        ty: u32,
    },
    TensorOffset {
        t: Index,
        edit: CountEdit,
    },
    TensorOffsetOf {
        t: Index,
        other: Index,
    },
    TensorName {
        t: Index,
        other: Index,
        swap: bool,
    },
    TensorDelete(Index),
    TensorDup(Index),
    PadAlign(u64),
    /// Four data bytes set to a pattern (NaN/inf f32, 0xff..).
    Data {
        pos: Index,
        pattern: u32,
    },
    /// Cut the file near a structure boundary.
    Truncate {
        at: Index,
        delta: i8,
    },
}

fn mutation() -> impl Strategy<Value = Mut> {
    let ix = any::<Index>;
    prop_oneof![
        1 => prop_oneof![Just(*b"GGUF"), Just(*b"GGUf"), Just([0u8; 4]), any::<[u8; 4]>()].prop_map(Mut::Magic),
        1 => prop_oneof![Just(0u32), Just(1), Just(2), Just(3), Just(4), Just(u32::MAX)].prop_map(Mut::Version),
        2 => count_edit().prop_map(Mut::TensorCount),
        2 => count_edit().prop_map(Mut::KvCount),
        8 => (ix(), val()).prop_map(|(key, val)| Mut::SetKey { key, val }),
        4 => (ix(), edge_int(), edge_float()).prop_map(|(kv, int, float)| Mut::Edge { kv, int, float }),
        2 => (ix(), prop_oneof![0u32..14, Just(u32::MAX)]).prop_map(|(kv, ty)| Mut::KvType { kv, ty }),
        2 => ix().prop_map(Mut::KvDelete),
        1 => ix().prop_map(Mut::KvDup),
        1 => (ix(), ix()).prop_map(|(kv, to)| Mut::KvRename { kv, to }),
        4 => (ix(), ix(), count_edit()).prop_map(|(target, item, edit)| Mut::StrLen { target, item, edit }),
        2 => (ix(), count_edit()).prop_map(|(kv, edit)| Mut::ArrLen { kv, edit }),
        2 => (ix(), prop_oneof![0u32..14, Just(u32::MAX)]).prop_map(|(kv, ty)| Mut::ArrElemType { kv, ty }),
        2 => (ix(), ix()).prop_map(|(kv, keep)| Mut::ArrKeep { kv, keep }),
        1 => (ix(), prop_oneof![0u32..=6, Just(u32::MAX)]).prop_map(|(t, n)| Mut::TensorNDims { t, n }),
        3 => (ix(), ix(), count_edit()).prop_map(|(t, d, v)| Mut::TensorDim { t, d, v }),
        1 => (ix(), any::<bool>()).prop_map(|(t, push)| Mut::TensorDimsPushPop { t, push }),
        2 => (ix(), prop_oneof![0u32..42, Just(1000), Just(u32::MAX)]).prop_map(|(t, ty)| Mut::TensorType { t, ty }),
        2 => (ix(), count_edit()).prop_map(|(t, edit)| Mut::TensorOffset { t, edit }),
        1 => (ix(), ix()).prop_map(|(t, other)| Mut::TensorOffsetOf { t, other }),
        1 => (ix(), ix(), any::<bool>()).prop_map(|(t, other, swap)| Mut::TensorName { t, other, swap }),
        1 => ix().prop_map(Mut::TensorDelete),
        1 => ix().prop_map(Mut::TensorDup),
        1 => prop_oneof![Just(0u64), Just(1), Just(8), Just(64), Just(4096)].prop_map(Mut::PadAlign),
        2 => (ix(), prop_oneof![Just(0x7fc0_0000u32), Just(0x7f80_0000), Just(0xff80_0000), Just(u32::MAX), Just(0)])
            .prop_map(|(pos, pattern)| Mut::Data { pos, pattern }),
        3 => (ix(), -4i8..=4).prop_map(|(at, delta)| Mut::Truncate { at, delta }),
    ]
}

/// A case: which seed, which edits.
pub fn case() -> impl Strategy<Value = (Index, Vec<Mut>)> {
    (any::<Index>(), proptest::collection::vec(mutation(), 1..5))
}

fn arch_of(g: &RawGguf) -> String {
    g.kvs
        .iter()
        .find(|kv| kv.key.bytes == b"general.architecture")
        .and_then(|kv| match &kv.val {
            RawVal::Str(s) => Some(String::from_utf8_lossy(&s.bytes).into_owned()),
            _ => None,
        })
        .unwrap_or_else(|| "llama".into())
}

/// Applies `m` (a no-op when its target does not exist); returns a cut.
fn apply(g: &mut RawGguf, m: &Mut) -> Option<(Index, i8)> {
    let nk = g.kvs.len();
    let nt = g.tensors.len();
    match m {
        Mut::Magic(b) => g.magic = *b,
        Mut::Version(v) => g.version = *v,
        Mut::TensorCount(e) => g.n_tensors_override = Some(e.apply(nt as u64)),
        Mut::KvCount(e) => g.n_kv_override = Some(e.apply(nk as u64)),
        Mut::SetKey { key, val } => {
            let k = KEYS[key.index(KEYS.len())].replace("{a}", &arch_of(g));
            let v = val.raw();
            match g.kvs.iter_mut().find(|kv| kv.key.bytes == k.as_bytes()) {
                Some(kv) => kv.val = v,
                None => g.kvs.push(RawKv {
                    key: RawStr::new(k.into_bytes()),
                    ty_override: None,
                    val: v,
                }),
            }
        }
        Mut::Edge { kv, int, float } if nk > 0 => {
            if let RawVal::Scalar { ty, bytes } = &mut g.kvs[kv.index(nk)].val {
                *bytes = match *ty {
                    6 => (*float as f32).to_le_bytes().to_vec(),
                    12 => float.to_le_bytes().to_vec(),
                    t => int.to_le_bytes()[..int_width(t)].to_vec(),
                };
            }
        }
        Mut::KvType { kv, ty } if nk > 0 => g.kvs[kv.index(nk)].ty_override = Some(*ty),
        Mut::KvDelete(i) if nk > 0 => {
            g.kvs.remove(i.index(nk));
        }
        Mut::KvDup(i) if nk > 0 => {
            let kv = g.kvs[i.index(nk)].clone();
            g.kvs.push(kv);
        }
        Mut::KvRename { kv, to } if nk > 0 => {
            g.kvs[kv.index(nk)].key = RawStr::new(
                KEYS[to.index(KEYS.len())]
                    .replace("{a}", &arch_of(g))
                    .into_bytes(),
            );
        }
        Mut::StrLen { target, item, edit } if nk + nt > 0 => {
            let i = target.index(nk + nt);
            let s = if i >= nk {
                &mut g.tensors[i - nk].name
            } else {
                let kv = &mut g.kvs[i];
                match &mut kv.val {
                    RawVal::Str(s) => s,
                    RawVal::Array { items, .. } if !items.is_empty() => {
                        let n = items.len();
                        match &mut items[item.index(n)] {
                            RawVal::Str(s) => s,
                            _ => &mut kv.key,
                        }
                    }
                    _ => &mut kv.key,
                }
            };
            s.len_override = Some(edit.apply(s.bytes.len() as u64));
        }
        Mut::ArrLen { kv, edit } => {
            if let Some(RawVal::Array {
                len_override,
                items,
                ..
            }) = arrays(g).nth_of(kv)
            {
                *len_override = Some(edit.apply(items.len() as u64));
            }
        }
        Mut::ArrElemType { kv, ty } => {
            if let Some(RawVal::Array { elem_ty, .. }) = arrays(g).nth_of(kv) {
                *elem_ty = *ty;
            }
        }
        Mut::ArrKeep { kv, keep } => {
            if let Some(RawVal::Array { items, .. }) = arrays(g).nth_of(kv) {
                let n = items.len();
                items.truncate(keep.index(n + 1));
            }
        }
        Mut::TensorNDims { t, n } if nt > 0 => g.tensors[t.index(nt)].n_dims_override = Some(*n),
        Mut::TensorDim { t, d, v } if nt > 0 => {
            let dims = &mut g.tensors[t.index(nt)].dims;
            if !dims.is_empty() {
                let j = d.index(dims.len());
                dims[j] = v.apply(dims[j]);
            }
        }
        Mut::TensorDimsPushPop { t, push } if nt > 0 => {
            let dims = &mut g.tensors[t.index(nt)].dims;
            if *push {
                dims.push(1);
            } else {
                dims.pop();
            }
        }
        Mut::TensorType { t, ty } if nt > 0 => g.tensors[t.index(nt)].ty = *ty,
        Mut::TensorOffset { t, edit } if nt > 0 => {
            let tt = &mut g.tensors[t.index(nt)];
            tt.offset = edit.apply(tt.offset);
        }
        Mut::TensorOffsetOf { t, other } if nt > 0 => {
            g.tensors[t.index(nt)].offset = g.tensors[other.index(nt)].offset;
        }
        Mut::TensorName { t, other, swap } if nt > 0 => {
            let (a, b) = (t.index(nt), other.index(nt));
            let nb = g.tensors[b].name.clone();
            if *swap {
                g.tensors[b].name = g.tensors[a].name.clone();
            }
            g.tensors[a].name = nb;
        }
        Mut::TensorDelete(i) if nt > 0 => {
            g.tensors.remove(i.index(nt));
        }
        Mut::TensorDup(i) if nt > 0 => {
            let t = g.tensors[i.index(nt)].clone();
            g.tensors.push(t);
        }
        Mut::PadAlign(a) => g.pad_align = *a,
        Mut::Data { pos, pattern } if g.data.len() >= 4 => {
            let p = pos.index(g.data.len() - 3);
            g.data[p..p + 4].copy_from_slice(&pattern.to_le_bytes());
        }
        Mut::Truncate { at, delta } => return Some((*at, *delta)),
        _ => {}
    }
    None
}

/// The array values among the metadata, for index-based picking.
struct Arrays<'a>(Vec<&'a mut RawVal>);

fn arrays(g: &mut RawGguf) -> Arrays<'_> {
    Arrays(
        g.kvs
            .iter_mut()
            .map(|kv| &mut kv.val)
            .filter(|v| matches!(v, RawVal::Array { .. }))
            .collect(),
    )
}

impl<'a> Arrays<'a> {
    fn nth_of(mut self, i: &Index) -> Option<&'a mut RawVal> {
        if self.0.is_empty() {
            return None;
        }
        let j = i.index(self.0.len());
        Some(self.0.swap_remove(j))
    }
}

/// The mutated file's bytes.
pub fn build(seed: &Index, muts: &[Mut]) -> Vec<u8> {
    let b = bases();
    let mut g = b[seed.index(b.len())].clone();
    let mut cut = None;
    for m in muts {
        if let Some(c) = apply(&mut g, m) {
            cut = Some(c);
        }
    }
    let w = g.to_bytes();
    let mut bytes = w.bytes;
    if let Some((at, delta)) = cut {
        let b = w.boundaries[at.index(w.boundaries.len())] as i64 + delta as i64;
        bytes.truncate(b.clamp(0, bytes.len() as i64) as usize);
    }
    bytes
}

/// What `quire run` does with a model file, then a little use of it.
pub fn load_and_use(path: &Path) -> anyhow::Result<()> {
    let opts = RunnerOptions {
        threads: Some(1),
        kv_tokens: Some(64),
        block_size: 16,
        ..Default::default()
    };
    let mut runner = Runner::load(path, &opts)?;
    let tok = Tokenizer::from_gguf(&runner.gguf)?;
    let ids = tok.encode("Hello, world! <|im_start|>ok\n", true, true)?;
    tok.decode(&ids, false)?;
    // The template is data too: an error is fine, a panic is not.
    let _ = tok.apply_chat_template(&[ChatMessage::new("user", "hi")], true);
    if ids.is_empty() {
        return Ok(());
    }
    let gen = GenerateOptions {
        max_tokens: 1,
        sampling: SamplingParams::greedy(),
        n_ubatch: 16,
        stop_ids: tok.stop_ids().to_vec(),
    };
    generate(
        &mut runner,
        SeqId(0),
        &ids[..ids.len().min(8)],
        &gen,
        &mut |_| Ok(true),
    )?;
    Ok(())
}

/// One case: write, load, check the outcome. Returns whether it loaded.
pub fn check(dir: &Path, bytes: &[u8]) -> Result<bool, TestCaseError> {
    let p = dir.join("case.gguf");
    std::fs::write(&p, bytes).map_err(|e| TestCaseError::fail(format!("writing: {e}")))?;
    match load_and_use(&p) {
        Ok(()) => Ok(true),
        Err(e) => {
            let msg = format!("{e:#}");
            prop_assert!(!msg.trim().is_empty(), "empty error message");
            prop_assert!(
                msg.len() <= MAX_ERROR_LEN,
                "error message of {} bytes: {}...",
                msg.len(),
                &msg[..msg.floor_char_boundary_compat(600)]
            );
            Ok(false)
        }
    }
}

trait FloorBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorBoundary for str {
    fn floor_char_boundary_compat(&self, i: usize) -> usize {
        let mut i = i.min(self.len());
        while !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}
