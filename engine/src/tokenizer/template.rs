//! The chat-template environment: minijinja set up the way transformers sets up its
//! Jinja2 sandbox (trim_blocks, lstrip_blocks, Python string methods, `raise_exception`,
//! `strftime_now`, and transformers' own `tojson`).

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, ErrorKind};

use crate::error::Error;

pub(super) const TEMPLATE_NAME: &str = "chat_template";
/// Largest chat template source accepted (real ones are a few KiB).
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;
/// minijinja fuel of one rendering: instructions run before it stops with an error. A
/// long conversation through a real template takes well under a million; a template
/// that loops forever stops after about a second.
pub const TEMPLATE_FUEL: u64 = 50_000_000;
/// Largest rendered prompt (the OpenAI endpoints take 4 MiB bodies).
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// Collects the rendered text, failing once it passes [`MAX_RENDERED_BYTES`].
#[derive(Default)]
pub(super) struct CappedWriter {
    pub buf: Vec<u8>,
    pub overflowed: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > MAX_RENDERED_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("rendered prompt too long"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
/// Marks the errors that `raise_exception` creates.
const RAISED: &str = "\u{1}raise_exception:";

pub(super) fn template_error(e: minijinja::Error) -> Error {
    // raise_exception(msg): just the template author's message, as transformers shows it.
    match e.detail().and_then(|d| d.strip_prefix(RAISED)) {
        Some(msg) => Error::Template(msg.to_string()),
        None => Error::Template(e.to_string()),
    }
}

/// A minijinja environment that behaves like transformers' Jinja2 sandbox.
pub(super) fn template_env(source: &str) -> std::result::Result<Environment<'static>, String> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .map_err(|e| e.to_string())?;
    env.set_syntax(syntax);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    minijinja_contrib::add_to_environment(&mut env);
    env.set_formatter(|out, state, value| match value.kind() {
        // Python prints True / False / None.
        ValueKind::Bool => out.write_str(if value.is_true() { "True" } else { "False" }).map_err(Into::into),
        ValueKind::None => out.write_str("None").map_err(Into::into),
        _ => minijinja::escape_formatter(out, state, value),
    });
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{msg}")))
    });
    env.add_function("strftime_now", |fmt: String| strftime(&fmt, now_unix()));
    env.add_template_owned(TEMPLATE_NAME, source.to_owned()).map_err(|e| format!("cannot compile: {e}"))?;
    Ok(env)
}

#[cfg(not(target_arch = "wasm32"))]
fn now_unix() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// wasm32-unknown-unknown has no clock without JS; templates get a fixed date.
#[cfg(target_arch = "wasm32")]
fn now_unix() -> i64 {
    1_721_952_000 // 2024-07-26, the default date in Llama 3 templates
}

/// A small strftime (UTC) for `strftime_now`: %Y %y %m %d %e %B %b %h %A %a %H %I %M %S %p %j %%.
fn strftime(fmt: &str, unix: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let (h, min, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let piece = match chars.next() {
            Some('Y') => y.to_string(),
            Some('y') => format!("{:02}", y.rem_euclid(100)),
            Some('m') => format!("{m:02}"),
            Some('d') => format!("{d:02}"),
            Some('e') => format!("{d:2}"),
            Some('B') => month.to_string(),
            Some('b') | Some('h') => month[..3].to_string(),
            Some('A') => DAYS[wday].to_string(),
            Some('a') => DAYS[wday][..3].to_string(),
            Some('H') => format!("{h:02}"),
            Some('I') => format!("{:02}", (h + 11) % 12 + 1),
            Some('M') => format!("{min:02}"),
            Some('S') => format!("{s:02}"),
            Some('p') => (if h < 12 { "AM" } else { "PM" }).to_string(),
            Some('j') => format!("{yday:03}"),
            Some('%') => "%".to_string(),
            Some(other) => format!("%{other}"),
            None => "%".to_string(),
        };
        out.push_str(&piece);
    }
    out
}

/// transformers' `tojson`: Python `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, which (unlike Jinja's) escapes no HTML and puts a
/// space after `,` and `:`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        Some(v) if !v.is_none() => Some(v.as_usize().ok_or_else(|| {
            minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: indent must be a non-negative integer")
        })?),
        _ => None,
    };
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([a, b]) => (a.clone(), b.clone()),
        Some(_) => return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair")),
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let mut w = PyJson {
        out: String::new(),
        ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    w.value(value, 0)?;
    Ok(Value::from(w.out))
}

struct PyJson {
    out: String,
    ascii: bool,
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl PyJson {
    fn value(&mut self, v: &Value, depth: usize) -> std::result::Result<(), minijinja::Error> {
        if depth > 256 {
            return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: nesting too deep"));
        }
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => self.out.push_str(&v.to_string()),
            ValueKind::Number => self.out.push_str(&py_float(f64::try_from(v.clone())?)),
            ValueKind::String | ValueKind::Plain => self.string(&v.to_string()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort_by_key(|k| k.to_string());
                }
                let items = keys
                    .into_iter()
                    .map(|k| Ok((k.clone(), v.get_item(&k)?)))
                    .collect::<std::result::Result<Vec<_>, minijinja::Error>>()?;
                self.container('{', '}', items.len(), depth, |w, i| {
                    let (k, val) = &items[i];
                    match k.kind() {
                        ValueKind::None => w.out.push_str("\"null\""),
                        ValueKind::Bool | ValueKind::Number => w.string(&json_key(k)),
                        _ => w.string(&k.to_string()),
                    }
                    w.out.push_str(&w.key_sep.clone());
                    w.value(val, depth + 1)
                })?;
            }
            ValueKind::Seq | ValueKind::Iterable | ValueKind::Bytes => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container('[', ']', items.len(), depth, |w, i| w.value(&items[i], depth + 1))?;
            }
            _ => return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: cannot serialize this value")),
        }
        Ok(())
    }

    fn container(
        &mut self,
        open: char,
        close: char,
        n: usize,
        depth: usize,
        mut item: impl FnMut(&mut Self, usize) -> std::result::Result<(), minijinja::Error>,
    ) -> std::result::Result<(), minijinja::Error> {
        self.out.push(open);
        if n == 0 {
            self.out.push(close);
            return Ok(());
        }
        for i in 0..n {
            if i > 0 {
                self.out.push_str(&self.item_sep.clone());
            }
            if let Some(ind) = self.indent {
                self.out.push('\n');
                self.out.push_str(&" ".repeat(ind * (depth + 1)));
            }
            item(self, i)?;
        }
        if let Some(ind) = self.indent {
            self.out.push('\n');
            self.out.push_str(&" ".repeat(ind * depth));
        }
        self.out.push(close);
        Ok(())
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ascii && (c as u32) > 0x7e) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// How Python's json turns a bool or number key into a string.
fn json_key(k: &Value) -> String {
    match k.kind() {
        ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number if !k.is_integer() => f64::try_from(k.clone()).map(py_float).unwrap_or_default(),
        _ => k.to_string(),
    }
}

/// Python's `repr(float)` as json.dumps writes it (NaN/Infinity included).
fn py_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    // Shortest round-trip digits and decimal exponent from Rust's `{:e}`.
    let sci = format!("{v:e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let neg = mant.starts_with('-');
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if neg { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let s = if exp >= 0 {
            let e = exp as usize;
            let int: String = digits.chars().chain(std::iter::repeat('0')).take(e.max(digits.len() - 1) + 1).collect();
            let (i, f) = int.split_at(e + 1);
            format!("{i}.{}", if f.is_empty() { "0" } else { f })
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{s}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        format!("{sign}{first}{frac}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python() {
        let f = "%Y-%m-%d %H:%M:%S %A %a %B %b %j %y %I%p %e %%";
        assert_eq!(strftime(f, 0), "1970-01-01 00:00:00 Thursday Thu January Jan 001 70 12AM  1 %");
        assert_eq!(strftime(f, 1_721_952_000), "2024-07-26 00:00:00 Friday Fri July Jul 208 24 12AM 26 %");
        assert_eq!(strftime(f, 951_782_400), "2000-02-29 00:00:00 Tuesday Tue February Feb 060 00 12AM 29 %");
        assert_eq!(strftime(f, 1_735_689_599), "2024-12-31 23:59:59 Tuesday Tue December Dec 366 24 11PM 31 %");
        assert_eq!(strftime("%d %b %Y %Q%", 0), "01 Jan 1970 %Q%");
    }

    #[test]
    fn floats_print_like_python_repr() {
        let cases: [(f64, &str); 14] = [
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
            (-0.0, "-0.0"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (12345678901234567.0, "1.2345678901234568e+16"),
            (0.5, "0.5"),
            (100.0, "100.0"),
            (2.5, "2.5"),
            (-3.25e-5, "-3.25e-05"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (v, want) in cases {
            assert_eq!(py_float(v), want, "{v}");
        }
    }
}
