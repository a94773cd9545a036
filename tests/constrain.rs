//! Grammars over the default model's vocabulary (src/constrain), without a
//! model: random walks through the masks must produce outputs the grammar
//! describes, stop tokens come only where the output is complete, masks
//! are a function of the tokens alone, and bad grammars are errors.

use quire::constrain::{Constraint, GrammarSpec, Grammars};
use quire::sampler::{RowMasks, Sampler, SamplingParams, TokenMask, WordMask};
use quire::tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

fn load() -> Option<(Tokenizer, Grammars)> {
    let path = match quire::fetch::default_model_path() {
        Ok(p) => p,
        Err(e) => {
            println!("SKIPPED: default model unavailable: {e:#}");
            return None;
        }
    };
    let tok = Tokenizer::from_gguf_path(&path).expect("loading the default model's tokenizer");
    let g = Grammars::new(&tok).expect("building the grammar vocabulary");
    Some((tok, g))
}

/// Walks `c` with random logits (seeded) through the masked sampler until a
/// stop token or `max` tokens; returns the generated ids (stop excluded)
/// and whether a stop token ended it.
fn walk(c: &mut Constraint, tok: &Tokenizer, seed: u64, max: usize) -> (Vec<u32>, bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut sampler = Sampler::new(SamplingParams {
        temperature: 1.0,
        seed,
        ..SamplingParams::greedy()
    })
    .unwrap();
    let stops = tok.stop_ids().to_vec();
    let mut out = Vec::new();
    for _ in 0..max {
        // Random logits with the stop tokens favoured, so walks end soon
        // after the grammar allows it.
        let logits: Vec<f32> = (0..tok.vocab_size() as u32)
            .map(|t| {
                if stops.contains(&t) {
                    8.0
                } else {
                    rng.random_range(-4.0..4.0)
                }
            })
            .collect();
        let a = c.allows(&stops).expect("mask");
        let t = sampler
            .sample_masked(&logits, &out, None, Some(&a))
            .expect("sampling");
        if stops.contains(&t) {
            return (out, true);
        }
        c.commit(t).expect("commit");
        out.push(t);
    }
    (out, false)
}

fn text(tok: &Tokenizer, ids: &[u32]) -> String {
    tok.decode(ids, false).unwrap()
}

/// A small validator for the schema subset the tests generate.
fn valid(v: &Value, s: &Value) -> bool {
    if let Some(e) = s.get("enum") {
        return e.as_array().unwrap().contains(v);
    }
    match s["type"].as_str().unwrap() {
        "string" => v.as_str().is_some_and(|x| {
            s.get("maxLength")
                .is_none_or(|m| x.chars().count() as u64 <= m.as_u64().unwrap())
        }),
        "integer" => v.as_i64().is_some_and(|x| {
            s.get("minimum").is_none_or(|m| x >= m.as_i64().unwrap())
                && s.get("maximum").is_none_or(|m| x <= m.as_i64().unwrap())
        }),
        "number" => v.as_f64().is_some_and(|x| {
            s.get("minimum").is_none_or(|m| x >= m.as_f64().unwrap())
                && s.get("maximum").is_none_or(|m| x <= m.as_f64().unwrap())
        }),
        "boolean" => v.is_boolean(),
        "array" => v.as_array().is_some_and(|a| {
            s.get("maxItems")
                .is_none_or(|m| a.len() as u64 <= m.as_u64().unwrap())
                && a.iter().all(|x| valid(x, &s["items"]))
        }),
        "object" => v.as_object().is_some_and(|o| {
            let props = s["properties"].as_object().unwrap();
            let req: Vec<&str> = s["required"]
                .as_array()
                .map(|r| r.iter().map(|x| x.as_str().unwrap()).collect())
                .unwrap_or_default();
            req.iter().all(|k| o.contains_key(*k))
                && o.iter()
                    .all(|(k, x)| props.get(k).is_some_and(|ps| valid(x, ps)))
        }),
        t => panic!("schema type {t}"),
    }
}

/// A random schema of the subset `valid` knows (depth-bounded).
fn random_schema(rng: &mut ChaCha8Rng, depth: u32) -> Value {
    let k = if depth == 0 {
        rng.random_range(0..5)
    } else {
        rng.random_range(0..7)
    };
    match k {
        0 => json!({"type": "string", "maxLength": rng.random_range(1..12)}),
        1 => {
            let lo = rng.random_range(-50..50);
            json!({"type": "integer", "minimum": lo, "maximum": lo + rng.random_range(0..100)})
        }
        2 => json!({"type": "boolean"}),
        3 => json!({"enum": ["red", "green", "blue", 7, null]}),
        4 => json!({"type": "number", "minimum": -1000, "maximum": 1000}),
        5 => json!({"type": "array", "items": random_schema(rng, depth - 1),
                     "maxItems": rng.random_range(1..4)}),
        _ => {
            let n = rng.random_range(1..4);
            let mut props = serde_json::Map::new();
            let mut req = Vec::new();
            for i in 0..n {
                let key = format!("k{i}_{}", rng.random_range(0..100));
                if rng.random_bool(0.7) {
                    req.push(json!(key));
                }
                props.insert(key, random_schema(rng, depth - 1));
            }
            json!({"type": "object", "properties": props, "required": req,
                   "additionalProperties": false})
        }
    }
}

#[test]
fn random_schemas_yield_valid_json() {
    let Some((tok, g)) = load() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let mut ended = 0;
    for case in 0..20u64 {
        let mut schema = random_schema(&mut rng, 2);
        if schema["type"] != "object" {
            schema = json!({"type": "object", "properties": {"v": schema}, "required": ["v"],
                            "additionalProperties": false});
        }
        let grammar = g
            .compile(&GrammarSpec::JsonSchema(schema.clone()))
            .unwrap_or_else(|e| panic!("case {case}: {schema}: {e:#}"));
        let (ids, stopped) = walk(&mut grammar.start(), &tok, case, 400);
        let s = text(&tok, &ids);
        if !stopped {
            // Random logits may wander in a long number; the prefix must
            // still be on the grammar's path, which commit checked.
            continue;
        }
        ended += 1;
        let v: Value = serde_json::from_str(&s)
            .unwrap_or_else(|e| panic!("case {case}: {s:?} is not JSON ({e}); schema {schema}"));
        assert!(valid(&v, &schema), "case {case}: {s} does not fit {schema}");
    }
    assert!(ended >= 15, "only {ended} of 20 walks ended");
}

#[test]
fn json_object_regex_and_lark() {
    let Some((tok, g)) = load() else { return };
    for seed in 0..5 {
        let (ids, stopped) = walk(
            &mut g.compile(&GrammarSpec::JsonObject).unwrap().start(),
            &tok,
            seed,
            300,
        );
        if stopped {
            let v: Value = serde_json::from_str(&text(&tok, &ids)).unwrap();
            assert!(v.is_object(), "{v}");
        }
        let rx = g
            .compile(&GrammarSpec::Regex("[0-9]{3}-[a-z]{2,4}".into()))
            .unwrap();
        let (ids, stopped) = walk(&mut rx.start(), &tok, seed, 50);
        assert!(stopped);
        let s = text(&tok, &ids);
        let (a, b) = s.split_once('-').unwrap();
        assert!(a.len() == 3 && a.bytes().all(|c| c.is_ascii_digit()), "{s}");
        assert!(
            (2..=4).contains(&b.len()) && b.bytes().all(|c| c.is_ascii_lowercase()),
            "{s}"
        );
        let lark = g
            .compile(&GrammarSpec::Lark(
                "start: (\"yes\" | \"no\") \" \" %json {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 9}\n"
                    .into(),
            ))
            .unwrap();
        let (ids, stopped) = walk(&mut lark.start(), &tok, seed, 50);
        assert!(stopped);
        let s = text(&tok, &ids);
        let (w, d) = s.split_once(' ').unwrap();
        assert!(w == "yes" || w == "no", "{s}");
        assert!(d.parse::<u32>().is_ok_and(|d| d <= 9), "{s}");
    }
}

/// Stop tokens are refused until the grammar is complete, then allowed;
/// once nothing else fits, only they are.
#[test]
fn stops_only_where_complete() {
    let Some((tok, g)) = load() else { return };
    let gr = g.compile(&GrammarSpec::Regex("ab?".into())).unwrap();
    let stops = tok.stop_ids().to_vec();
    let mut c = gr.start();
    assert!(!c.allows(&stops).unwrap().end());
    assert!(stops.iter().all(|&t| !c.allows(&stops).unwrap().allows(t)));
    let a_id = tok.encode("a", false, false).unwrap();
    assert_eq!(a_id.len(), 1);
    assert!(c.allows(&stops).unwrap().allows(a_id[0]));
    c.commit(a_id[0]).unwrap();
    assert!(c.allows(&stops).unwrap().end(), "\"a\" is complete");
    assert!(stops.iter().all(|&t| c.allows(&stops).unwrap().allows(t)));
    let b_id = tok.encode("b", false, false).unwrap()[0];
    assert!(c.allows(&stops).unwrap().allows(b_id));
    c.commit(b_id).unwrap();
    let a = c.allows(&stops).unwrap();
    assert!(a.end());
    assert!(
        (0..tok.vocab_size() as u32).all(|t| a.allows(t) == stops.contains(&t)),
        "after \"ab\" only a stop token fits"
    );
    // A token the mask refuses is an error, not a silent step.
    let mut c = gr.start();
    assert!(c.commit(b_id).is_err());
}

/// The mask depends only on the committed tokens: two matchers walked the
/// same way agree bit for bit at every step.
#[test]
fn masks_are_functions_of_tokens() {
    let Some((tok, g)) = load() else { return };
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                        "n": {"type": "integer"}}, "required": ["name", "n"]});
    let gr = g.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let (ids, _) = walk(&mut gr.start(), &tok, 3, 60);
    let (mut x, mut y) = (gr.start(), gr.start());
    // y is prepared early (as the engine does, overlapped), x late.
    y.prepare();
    for &t in &ids {
        let stops = tok.stop_ids();
        let (ax, ay) = (x.allows(stops).unwrap(), y.allows(stops).unwrap());
        assert_eq!(ax.end(), ay.end());
        assert!((0..tok.vocab_size() as u32).all(|i| ax.allows(i) == ay.allows(i)));
        x.commit(t).unwrap();
        y.commit(t).unwrap();
        y.prepare();
    }
}

#[test]
fn bad_grammars_are_errors() {
    let Some((_, g)) = load() else { return };
    let bad = [
        GrammarSpec::Lark("start: (".into()),
        GrammarSpec::Lark("start: undefined_rule\n".into()),
        GrammarSpec::Regex("(".into()),
        GrammarSpec::JsonSchema(json!({"type": "no-such-type"})),
        GrammarSpec::JsonSchema(json!({"$ref": "#/definitions/missing"})),
    ];
    for spec in bad {
        let e = g.compile(&spec).err();
        assert!(e.is_some(), "{spec:?} compiled");
        let msg = format!("{:#}", e.unwrap());
        assert!(!msg.is_empty() && msg.len() < 4000, "{msg}");
    }
}

/// `apply` (word by word) agrees with `allows` (token by token) on every
/// id, keeps the allowed logits' bits, and refuses ids past the vocabulary;
/// so do the words written for the device draw.
#[test]
fn apply_matches_allows() {
    let Some((tok, g)) = load() else { return };
    let stops = tok.stop_ids().to_vec();
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"},
                        "b": {"type": "array", "items": {"type": "integer"}}}});
    let gr = g.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let (ids, _) = walk(&mut gr.start(), &tok, 9, 40);
    let mut c = gr.start();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let n = tok.vocab_size() + 37;
    for k in 0..=ids.len() {
        let a = c.allows(&stops).unwrap();
        let logits: Vec<f32> = (0..n).map(|_| rng.random_range(-9.0..9.0)).collect();
        let mut masked = logits.clone();
        assert!(a.apply(&mut masked));
        for i in 0..n {
            let want = if a.allows(i as u32) && i < tok.vocab_size() {
                logits[i].to_bits()
            } else {
                f32::NEG_INFINITY.to_bits()
            };
            assert_eq!(masked[i].to_bits(), want, "step {k}, id {i}");
        }
        // The words the device draw reads allow the same ids and mask a
        // vocabulary row to the same bits.
        let v = tok.vocab_size();
        let mut words = vec![u32::MAX; RowMasks::words_for(v)];
        a.write_words(&mut words);
        let w = WordMask::new(&words);
        for i in 0..v as u32 {
            assert_eq!(w.allows(i), a.allows(i), "step {k}, id {i}: words");
        }
        let (mut by_words, mut by_allowed) = (logits[..v].to_vec(), logits[..v].to_vec());
        assert!(w.apply(&mut by_words) && a.apply(&mut by_allowed));
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&by_words), bits(&by_allowed), "step {k}: words apply");
        if let Some(&t) = ids.get(k) {
            c.commit(t).unwrap();
        }
    }
}

/// Forced tool calls in each format: random walks through the grammar give
/// outputs the format's parser reads as calls to the allowed functions,
/// with arguments that fit their parameters (extra keys refused).
#[test]
fn tool_grammars_parse_as_calls() {
    use quire::server::api::ForcedTools;
    use quire::server::structured::tool_grammar;
    use quire::server::tools::{parse, ToolFormat};
    let Some((tok, g)) = load() else { return };
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10},
                           "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
        {"type": "function", "function": {"name": "ping"}},
    ]);
    let tools = tools.as_array().unwrap();
    for format in [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral] {
        for (forced, parallel) in [
            (ForcedTools::Required, true),
            (ForcedTools::Required, false),
            (ForcedTools::Named("get_weather".into()), true),
        ] {
            let spec = tool_grammar(format, tools, &forced, parallel, &tok);
            let gr = g
                .compile(&spec)
                .unwrap_or_else(|e| panic!("{format:?} {forced:?}: {e:#}\n{spec:?}"));
            for seed in 0..4 {
                let (ids, stopped) = walk(&mut gr.start(), &tok, seed, 300);
                assert!(
                    stopped,
                    "{format:?} {forced:?} seed {seed}: did not end: {:?}",
                    text(&tok, &ids)
                );
                let out = text(&tok, &ids);
                let p = parse(format, &out);
                assert!(!p.calls.is_empty(), "{format:?}: no call in {out:?}");
                assert!(
                    p.content.trim().is_empty(),
                    "{format:?}: text {:?}",
                    p.content
                );
                if !parallel
                    || matches!(forced, ForcedTools::Named(_))
                    || format == ToolFormat::Llama3
                {
                    assert_eq!(p.calls.len(), 1, "{format:?} {forced:?}: {out:?}");
                }
                for c in &p.calls {
                    if let ForcedTools::Named(n) = &forced {
                        assert_eq!(&c.name, n);
                    }
                    let args: Value = serde_json::from_str(&c.arguments).unwrap();
                    let o = args.as_object().unwrap();
                    match c.name.as_str() {
                        "get_weather" => {
                            assert_eq!(o.len(), 2, "{out}");
                            assert!(o["city"].as_str().unwrap().chars().count() <= 10);
                            assert!(o["unit"] == "c" || o["unit"] == "f");
                        }
                        "ping" => {}
                        n => panic!("unknown function {n} in {out:?}"),
                    }
                }
            }
        }
    }
}
