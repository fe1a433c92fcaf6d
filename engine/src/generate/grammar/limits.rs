//! Bounds on what one grammar may ask of the compiler, checked before llguidance sees it.
//!
//! llguidance compiles recursively: each `$ref` it follows, each nested subschema, each
//! property of an object (its ordered sequence) and each Lark rule that names another is a
//! stack frame or several. A request can chain thousands in a few kilobytes and overflow
//! the stack of whatever thread compiles it, which aborts the whole process. These checks
//! walk the input without recursion and refuse, with a message naming the limit, anything
//! deeper or larger than what compiles within a small stack (the browser's 1 MiB wasm
//! stack included; the numbers are in docs/api.md, "Limits").

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::Grammar;
use crate::error::{Error, Result};

/// Longest chain of nested subschemas and `$ref` links followed from the root.
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// Most properties in one object schema.
pub const MAX_OBJECT_PROPERTIES: usize = 1_000;
/// Most properties in all the object schemas of one schema together.
pub const MAX_SCHEMA_PROPERTIES: usize = 5_000;
/// Most JSON values (objects, arrays, strings, numbers...) in one schema.
pub const MAX_SCHEMA_VALUES: usize = 100_000;
/// Longest grammar text (Lark, GBNF, regular expression), in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;
/// Longest chain of Lark/GBNF rules naming each other, with the groups nested inside them.
pub const MAX_GRAMMAR_DEPTH: usize = 64;

/// The nesting serde_json's parser refuses ("recursion limit exceeded"): a document with
/// this many arrays/objects open at once does not parse, on the server or in the browser.
pub const MAX_JSON_NESTING: usize = 128;

/// How deeply a JSON text nests arrays and objects (the most open at once), counted
/// without parsing and without recursion (brackets inside strings are skipped). The
/// surfaces use it, not the parser's message text, to say that a body failed to parse
/// because it nests past [`MAX_JSON_NESTING`].
pub fn json_nesting(text: &[u8]) -> usize {
    let (mut depth, mut most, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in text {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                most = most.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    most
}

fn refuse(what: &str, msg: String) -> Error {
    Error::Invalid(format!("{what}: {msg}"))
}

impl Grammar {
    /// Refuses a grammar past the compile limits (this module's constants) with a message
    /// naming the limit. Never recursive, linear in the input's size.
    pub fn check_limits(&self) -> Result<()> {
        match self {
            Grammar::JsonObject => Ok(()),
            Grammar::JsonSchema { schema, .. } => check_schema(schema).map(|_| ()),
            Grammar::Lark(text) => check_lark(text, "grammar"),
            Grammar::Gbnf(text) => {
                check_size(text, "grammar")?;
                check_lark(&super::gbnf_to_lark(text)?, "grammar")
            }
            Grammar::Regex(text) => check_size(text, "regex"),
        }
    }
}

fn check_size(text: &str, what: &str) -> Result<()> {
    if text.len() > MAX_GRAMMAR_BYTES {
        return Err(refuse(what, format!("{} bytes, over the limit of {MAX_GRAMMAR_BYTES}", text.len())));
    }
    Ok(())
}

/// A `$ref` resolved within the document: `#` and `#/json/pointer` (with `~0`, `~1` and
/// percent escapes). Anything else (another document, an anchor, a `$id` base) is None.
fn resolve<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    let frag = r.strip_prefix('#')?;
    if frag.is_empty() {
        return Some(root);
    }
    let mut at = root;
    for part in frag.strip_prefix('/')?.split('/') {
        let part = percent_decode(part)?.replace("~1", "/").replace("~0", "~");
        at = match at {
            Value::Object(m) => m.get(&part)?,
            Value::Array(a) => a.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_string());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// What [`check_schema`] measured.
#[derive(Debug, PartialEq)]
pub struct SchemaSize {
    pub values: usize,
    pub depth: usize,
    pub properties: usize,
}

/// Checks a JSON Schema against the limits; its measure when within them.
pub fn check_schema(schema: &Value) -> Result<SchemaSize> {
    const WHAT: &str = "JSON schema";
    // Size first (an explicit stack: no recursion), then the depth walk, which may visit
    // the targets of `$ref`s a second time but each value at most twice (memoised).
    let (mut values, mut properties, mut nested_ids) = (0usize, 0usize, false);
    let mut todo = vec![(schema, true)];
    while let Some((v, root)) = todo.pop() {
        values += 1;
        if values > MAX_SCHEMA_VALUES {
            return Err(refuse(WHAT, format!("more than {MAX_SCHEMA_VALUES} values")));
        }
        match v {
            Value::Object(m) => {
                if let Some(Value::Object(p)) = m.get("properties") {
                    if p.len() > MAX_OBJECT_PROPERTIES {
                        return Err(refuse(
                            WHAT,
                            format!("an object with {} properties, over the limit of {MAX_OBJECT_PROPERTIES}", p.len()),
                        ));
                    }
                    properties += p.len();
                    if properties > MAX_SCHEMA_PROPERTIES {
                        return Err(refuse(
                            WHAT,
                            format!("more than {MAX_SCHEMA_PROPERTIES} properties in all its objects"),
                        ));
                    }
                }
                nested_ids |= !root && m.get("$id").is_some_and(Value::is_string);
                todo.extend(m.values().map(|c| (c, false)));
            }
            Value::Array(a) => todo.extend(a.iter().map(|c| (c, false))),
            _ => {}
        }
    }
    let depth = schema_depth(schema, nested_ids)?;
    Ok(SchemaSize { values, depth, properties })
}

/// The longest chain of nested objects and arrays and `$ref` links, each target counted
/// from where it is first reached (llguidance compiles a target once, marking it before it
/// descends, so a cycle ends where it closes). A `$ref` this walk cannot resolve, or any
/// `$ref` when subschemas set their own `$id` (which changes what `#` means), may lead
/// anywhere: each distinct one adds the depth of the whole document again.
fn schema_depth(root: &Value, nested_ids: bool) -> Result<usize> {
    struct Frame<'a> {
        v: &'a Value,
        children: Vec<&'a Value>,
        next: usize,
        best: usize,
    }
    let mut unresolved: HashSet<&str> = HashSet::new();
    // The containers right below `v`, and the target of its `$ref`.
    fn children<'a>(
        root: &'a Value,
        v: &'a Value,
        nested_ids: bool,
        unresolved: &mut HashSet<&'a str>,
    ) -> Vec<&'a Value> {
        let mut out: Vec<&Value> = match v {
            Value::Object(m) => m.values().filter(|c| c.is_object() || c.is_array()).collect(),
            Value::Array(a) => a.iter().filter(|c| c.is_object() || c.is_array()).collect(),
            _ => Vec::new(),
        };
        if let Some(r) = v.get("$ref").and_then(Value::as_str) {
            match resolve(root, r).filter(|_| !nested_ids) {
                Some(t) => out.push(t),
                None => {
                    unresolved.insert(r);
                }
            }
        }
        out
    }
    let key = |v: &Value| v as *const Value;
    let mut memo: HashMap<*const Value, usize> = HashMap::new();
    let mut on_path: HashSet<*const Value> = HashSet::new();
    on_path.insert(key(root));
    let first = children(root, root, nested_ids, &mut unresolved);
    let mut stack = vec![Frame { v: root, children: first, next: 0, best: 0 }];
    let mut depth = 0;
    while let Some(top) = stack.last_mut() {
        if let Some(&c) = top.children.get(top.next) {
            top.next += 1;
            if let Some(&d) = memo.get(&key(c)) {
                top.best = top.best.max(d);
            } else if !on_path.contains(&key(c)) {
                if stack.len() >= MAX_SCHEMA_DEPTH {
                    return Err(too_deep());
                }
                on_path.insert(key(c));
                let children = children(root, c, nested_ids, &mut unresolved);
                stack.push(Frame { v: c, children, next: 0, best: 0 });
            }
            continue;
        }
        let done = stack.pop().expect("the stack is not empty");
        let d = done.best + 1;
        memo.insert(key(done.v), d);
        on_path.remove(&key(done.v));
        match stack.last_mut() {
            Some(parent) => parent.best = parent.best.max(d),
            None => depth = d,
        }
    }
    let depth = depth.saturating_mul(unresolved.len() + 1);
    if depth > MAX_SCHEMA_DEPTH {
        return Err(too_deep());
    }
    Ok(depth)
}

fn too_deep() -> Error {
    refuse("JSON schema", format!("nested subschemas and $ref links deeper than {MAX_SCHEMA_DEPTH} levels"))
}

/// One definition of a Lark grammar: the names its body mentions, each with the depth of
/// the groups around it, and the deepest group or `%json` schema in it.
#[derive(Default)]
struct Rule<'a> {
    refs: Vec<(&'a str, usize)>,
    own: usize,
}

/// Splits a Lark grammar into definitions (a name first on its line, then `:`), skipping
/// strings, regular expressions and comments: a name inside one of those is not a
/// reference. Over-counting is safe (a deeper estimate), so anything unclear is read as
/// names and brackets. Index 0 is what comes before the first definition.
fn lark_rules(text: &str) -> Result<(Vec<Rule<'_>>, HashMap<&str, usize>)> {
    let b = text.as_bytes();
    let mut rules: Vec<Rule<'_>> = vec![Rule::default()];
    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut cur = 0;
    let mut nest = 0usize;
    let mut line_start = true;
    let mut i = 0;
    let is_name = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line_start = true;
            i += 1;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let first_on_line = std::mem::replace(&mut line_start, false);
        match c {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' | b'/' => {
                // A string or a regex: to the closing quote or slash on this line.
                let mut j = i + 1;
                while j < b.len() && b[j] != c && b[j] != b'\n' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                i = if j < b.len() && b[j] == c { j + 1 } else { i + 1 };
            }
            b'\\' => i += 2,
            b'(' | b'[' => {
                nest += 1;
                rules[cur].own = rules[cur].own.max(nest);
                i += 1;
            }
            b')' | b']' => {
                nest = nest.saturating_sub(1);
                i += 1;
            }
            b'%' if text[i..].starts_with("%json") => {
                i += 5;
                while i < b.len() && b[i].is_ascii_whitespace() {
                    i += 1;
                }
                let mut values = serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>();
                if let Some(Ok(v)) = values.next() {
                    let size = check_schema(&v)?;
                    rules[cur].own = rules[cur].own.max(nest + size.depth);
                    i += values.byte_offset();
                }
            }
            c if is_name(c) => {
                let start = i;
                while i < b.len() && is_name(b[i]) {
                    i += 1;
                }
                let name = &text[start..i];
                // `name:` or `name.2:` first on its line starts a definition.
                let mut j = i;
                while j < b.len() && (b[j] == b'.' || b[j].is_ascii_digit() || b[j] == b' ' || b[j] == b'\t') {
                    j += 1;
                }
                if first_on_line && b.get(j) == Some(&b':') && b.get(j + 1) != Some(&b':') {
                    if rules.len() > MAX_GRAMMAR_RULES {
                        return Err(refuse("grammar", format!("more than {MAX_GRAMMAR_RULES} rules")));
                    }
                    cur = *names.entry(name).or_insert_with(|| {
                        rules.push(Rule::default());
                        rules.len() - 1
                    });
                    nest = 0;
                    i = j + 1;
                } else {
                    rules[cur].refs.push((name, nest));
                }
            }
            _ => i += 1,
        }
    }
    Ok((rules, names))
}

/// Most rules and terminals in one Lark or GBNF grammar.
pub const MAX_GRAMMAR_RULES: usize = 5_000;

/// The Lark grammar's size and the longest chain of rules naming each other (groups
/// nested inside them count too).
fn check_lark(text: &str, what: &str) -> Result<()> {
    check_size(text, what)?;
    let (rules, names) = lark_rules(text)?;
    let too_deep =
        || refuse(what, format!("rules that name each other and nested groups deeper than {MAX_GRAMMAR_DEPTH} levels"));
    // The longest path through the definitions, memoised; a cycle ends where it closes.
    let mut memo: Vec<Option<usize>> = vec![None; rules.len()];
    let mut on_path = vec![false; rules.len()];
    for start in 0..rules.len() {
        if memo[start].is_some() {
            continue;
        }
        on_path[start] = true;
        // (rule, index of its next reference, deepest so far)
        let mut stack: Vec<(usize, usize, usize)> = vec![(start, 0, rules[start].own)];
        while let Some(top) = stack.last_mut() {
            if let Some(&(name, nest)) = rules[top.0].refs.get(top.1) {
                top.1 += 1;
                let Some(&r) = names.get(name) else { continue };
                if let Some(d) = memo[r] {
                    top.2 = top.2.max(nest + d);
                } else if !on_path[r] {
                    if stack.len() >= MAX_GRAMMAR_DEPTH {
                        return Err(too_deep());
                    }
                    on_path[r] = true;
                    stack.push((r, 0, rules[r].own));
                }
                continue;
            }
            let (r, _, best) = stack.pop().expect("the stack is not empty");
            let d = best + 1;
            if d > MAX_GRAMMAR_DEPTH {
                return Err(too_deep());
            }
            memo[r] = Some(d);
            on_path[r] = false;
            if let Some(parent) = stack.last_mut() {
                let nest = rules[parent.0].refs[parent.1 - 1].1;
                parent.2 = parent.2.max(nest + d);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `{"$defs": {"d0": {"$ref": "#/$defs/d1"}, ...}, "$ref": "#/$defs/d0"}`: n links.
    pub fn ref_chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
        }
        defs.insert(format!("d{n}"), json!({"type": "string"}));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    /// An object schema with n string properties.
    pub fn wide(n: usize) -> Value {
        let props: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
        json!({"type": "object", "properties": props})
    }

    fn err(g: Grammar) -> String {
        g.check_limits().unwrap_err().to_string()
    }

    #[test]
    fn ref_chains_are_measured_and_long_ones_refused() {
        let s = check_schema(&ref_chain(10)).unwrap();
        // The root, `$defs`, then d0 to d10.
        assert_eq!(s.depth, 13, "{s:?}");
        assert!(err(Grammar::json_schema(ref_chain(1000))).contains("deeper than 64 levels"));
        // A cycle ends where it closes; references to one target count once.
        let cyc = json!({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "null"}]},
                                   "b": {"items": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"});
        assert!(check_schema(&cyc).unwrap().depth < 10);
        let many = json!({"$defs": {"t": {"type": "string"}},
                          "properties": (0..500).map(|i| (format!("p{i}"), json!({"$ref": "#/$defs/t"}))).collect::<serde_json::Map<_, _>>()});
        assert!(check_schema(&many).unwrap().depth < 10);
        // Escaped pointers resolve; a reference elsewhere counts the document again.
        let esc = json!({"$defs": {"a/b~c": {"type": "string"}}, "$ref": "#/$defs/a~1b~0c"});
        assert_eq!(check_schema(&esc).unwrap().depth, 3);
        let away = json!({"$ref": "other.json#/x", "properties": {"a": {"type": "string"}}});
        assert_eq!(check_schema(&away).unwrap().depth, 6);
    }

    #[test]
    fn wide_and_large_schemas_are_refused() {
        assert!(check_schema(&wide(MAX_OBJECT_PROPERTIES)).is_ok());
        let e = err(Grammar::json_schema(wide(10_000)));
        assert!(e.contains("10000 properties, over the limit of 1000"), "{e}");
        let many: Vec<Value> = (0..10).map(|_| wide(600)).collect();
        let e = err(Grammar::json_schema(json!({"anyOf": many})));
        assert!(e.contains("more than 5000 properties"), "{e}");
        let big: Vec<Value> = (0..MAX_SCHEMA_VALUES).map(|i| json!(i)).collect();
        assert!(err(Grammar::json_schema(json!({"enum": big}))).contains("more than 100000 values"));
    }

    #[test]
    fn lark_rule_chains_and_sizes_are_refused() {
        let chain = |n: usize| {
            let mut g = String::from("start: r0\n");
            for i in 0..n {
                g.push_str(&format!("r{i}: \"x\" r{}\n", i + 1));
            }
            g.push_str(&format!("r{n}: \"end\"\n"));
            g
        };
        assert!(Grammar::Lark(chain(20)).check_limits().is_ok());
        assert!(err(Grammar::Lark(chain(2000))).contains("deeper than 64"));
        // Names inside strings, regexes and comments are not references.
        let g = "start: a \"b c d\" /e f/ // g\na: \"x\"\nb: c\nc: d\nd: \"y\"\n";
        assert!(Grammar::Lark(g.into()).check_limits().is_ok());
        // GBNF is measured after its translation.
        let mut gbnf = String::from("root ::= r0\n");
        for i in 0..200 {
            gbnf.push_str(&format!("r{i} ::= \"x\" r{}\n", i + 1));
        }
        gbnf.push_str("r200 ::= \"y\"\n");
        assert!(err(Grammar::Gbnf(gbnf)).contains("deeper than 64"));
        // A %json schema inside a Lark grammar is checked as one.
        let inline = format!("start: %json {}\n", ref_chain(1000));
        assert!(err(Grammar::Lark(inline)).contains("$ref"));
        assert!(err(Grammar::Regex("a".repeat(MAX_GRAMMAR_BYTES + 1))).contains("over the limit"));
    }
}

#[cfg(test)]
mod probe {
    //! `COLI_PROBE=shape:n:stack_kib cargo test ... probe -- --ignored`: compiles one shape
    //! on a thread of that stack, without the limits (an overflow aborts the process).
    use super::tests::{ref_chain, wide};
    use super::*;

    fn shape(name: &str, n: usize) -> Grammar {
        let lark_chain = |term: bool| {
            let r = |i: usize| if term { format!("T{i}") } else { format!("r{i}") };
            let mut g = format!("start: {}\n", r(0));
            for i in 0..n {
                g.push_str(&format!("{}: \"x\" {}\n", r(i), r(i + 1)));
            }
            g.push_str(&format!("{}: \"end\"\n", r(n)));
            g
        };
        match name {
            "ref" => Grammar::json_schema(ref_chain(n)),
            "wide" => Grammar::json_schema(wide(n)),
            "nest" => {
                let mut s = serde_json::json!({"type": "string"});
                for _ in 0..n {
                    s = serde_json::json!({"type": "object", "properties": {"a": s}, "required": ["a"]});
                }
                Grammar::json_schema(s)
            }
            "rule" => Grammar::Lark(lark_chain(false)),
            "term" => Grammar::Lark(lark_chain(true)),
            _ => panic!("unknown shape {name}"),
        }
    }

    #[test]
    #[ignore]
    fn probe() {
        let spec = std::env::var("COLI_PROBE").unwrap();
        let p: Vec<&str> = spec.split(':').collect();
        let (name, n, kib) = (p[0].to_string(), p[1].parse::<usize>().unwrap(), p[2].parse::<usize>().unwrap());
        let dir = std::path::PathBuf::from(format!("{}/../tests/fixtures/qwen2_moe", env!("CARGO_MANIFEST_DIR")));
        let tok = crate::tokenizer::Tokenizer::from_dir(&dir).unwrap();
        let g = shape(&name, n);
        let vocab = tok.grammar_vocab().unwrap();
        let t = std::time::Instant::now();
        let r = std::thread::Builder::new()
            .stack_size(kib * 1024)
            .spawn(move || {
                let parser = vocab.factory.create_parser(g.to_llguidance().unwrap());
                parser.map(|p| llguidance::Matcher::new(Ok(p)).compute_mask().map(|_| ()))
            })
            .unwrap()
            .join()
            .unwrap();
        println!(
            "PROBE {spec} {} ms: {:?}",
            t.elapsed().as_millis(),
            r.map_err(|e| e.to_string().chars().take(80).collect::<String>())
        );
    }
}

#[cfg(test)]
mod nesting_tests {
    use super::{json_nesting, MAX_JSON_NESTING};

    #[test]
    fn json_nesting_counts_open_brackets_outside_strings() {
        assert_eq!(json_nesting(b"1"), 0);
        assert_eq!(json_nesting(br#"{"a": [1, {"b": []}]}"#), 4);
        assert_eq!(json_nesting(br#"{"a": "[[[{{{\"[[["}"#), 1);
        assert_eq!(json_nesting(b"]]]]["), 1);
        // serde_json refuses exactly where the count reaches the limit, and not before.
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let limit = MAX_JSON_NESTING;
        let e = serde_json::from_str::<serde_json::Value>(&deep(limit)).unwrap_err();
        assert_eq!(json_nesting(deep(limit).as_bytes()), limit, "{e}");
        assert!(serde_json::from_str::<serde_json::Value>(&deep(limit - 1)).is_ok());
    }
}
