//! GBNF (llama.cpp's grammar format) translated to the Lark dialect llguidance reads.
//!
//! GBNF: `name ::= alternatives`, "literals" with escapes, `[a-z]` / `[^"\\]` character
//! classes, `.` for any character, `( )`, `|`, `* + ?`, `{m}` `{m,}` `{m,n}` `{,n}`, `#`
//! comments; the start rule is `root`. The Lark side: rules are lowercase names, `[...]`
//! means "optional", so classes become regexes (`/[a-z]/`), literals become JSON strings,
//! repeats stay as they are (llguidance takes `{m,n}`), and `start: root` is added.
//! Each rule is written on one line. A rule ends where the next `name ::=` begins, which
//! accepts every grammar llama.cpp accepts (and a few with looser line breaks).

use std::collections::HashMap;

use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Name(String),
    Define,
    Literal(String),
    /// A character class: negated, and its (first, last) ranges.
    Class(bool, Vec<(char, char)>),
    Any,
    Punct(char),
    Repeat(String),
}

fn err(line: usize, msg: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("GBNF line {line}: {msg}"))
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// One escaped character after a backslash (the backslash already taken).
fn escape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>, line: usize) -> Result<char> {
    let c = chars.next().ok_or_else(|| err(line, "a backslash at the end"))?;
    let hex = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>, n: usize| -> Result<char> {
        let s: String = (0..n).filter_map(|_| chars.next()).collect();
        u32::from_str_radix(&s, 16)
            .ok()
            .filter(|_| s.len() == n)
            .and_then(char::from_u32)
            .ok_or_else(|| err(line, format!("bad escape \\{c}{s}")))
    };
    Ok(match c {
        'n' => '\n',
        'r' => '\r',
        't' => '\t',
        'x' => hex(chars, 2)?,
        'u' => hex(chars, 4)?,
        'U' => hex(chars, 8)?,
        '\\' | '"' | '[' | ']' | '-' | '^' | '/' | '\'' => c,
        _ => return Err(err(line, format!("unknown escape \\{c}"))),
    })
}

fn lex(src: &str) -> Result<Vec<(Tok, usize)>> {
    let mut out = Vec::new();
    let mut line = 1;
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        let tok = match c {
            '\n' => {
                line += 1;
                continue;
            }
            c if c.is_whitespace() => continue,
            '#' => {
                while chars.peek().is_some_and(|&c| c != '\n') {
                    chars.next();
                }
                continue;
            }
            ':' => {
                if chars.next() == Some(':') && chars.next() == Some('=') {
                    Tok::Define
                } else {
                    return Err(err(line, "expected ::="));
                }
            }
            '"' => {
                let mut s = String::new();
                loop {
                    match chars.next() {
                        None => return Err(err(line, "unterminated string")),
                        Some('"') => break,
                        Some('\\') => s.push(escape(&mut chars, line)?),
                        Some('\n') => return Err(err(line, "a line break inside a string")),
                        Some(c) => s.push(c),
                    }
                }
                Tok::Literal(s)
            }
            '[' => {
                let negated = chars.peek() == Some(&'^');
                if negated {
                    chars.next();
                }
                let mut ranges = Vec::new();
                loop {
                    let first = match chars.next() {
                        None => return Err(err(line, "unterminated character class")),
                        Some(']') => break,
                        Some('\\') => escape(&mut chars, line)?,
                        Some(c) => c,
                    };
                    let mut last = first;
                    let mut ahead = chars.clone();
                    if ahead.next() == Some('-') && ahead.peek().is_some_and(|&c| c != ']') {
                        chars.next();
                        last = match chars.next() {
                            Some('\\') => escape(&mut chars, line)?,
                            Some(c) => c,
                            None => return Err(err(line, "unterminated character class")),
                        };
                        if last < first {
                            return Err(err(line, format!("empty range {first:?}-{last:?}")));
                        }
                    }
                    ranges.push((first, last));
                }
                Tok::Class(negated, ranges)
            }
            '.' => Tok::Any,
            '(' | ')' | '|' | '*' | '+' | '?' => Tok::Punct(c),
            '{' => {
                let mut s = String::from("{");
                for c in chars.by_ref() {
                    if !(c.is_ascii_digit() || c == ',' || c == '}' || c == ' ') {
                        return Err(err(line, "a repetition is {m}, {m,}, {m,n} or {,n}"));
                    }
                    if c != ' ' {
                        s.push(c);
                    }
                    if c == '}' {
                        break;
                    }
                }
                if !s.ends_with('}') || s == "{}" || s == "{,}" {
                    return Err(err(line, "a repetition is {m}, {m,}, {m,n} or {,n}"));
                }
                Tok::Repeat(s)
            }
            '<' => return Err(err(line, "token references (<...>) are not supported")),
            c if is_name_char(c) => {
                let mut s = String::from(c);
                while let Some(&c) = chars.peek().filter(|&&c| is_name_char(c)) {
                    s.push(c);
                    chars.next();
                }
                Tok::Name(s)
            }
            c => return Err(err(line, format!("unexpected character {c:?}"))),
        };
        out.push((tok, line));
    }
    Ok(out)
}

/// A Lark rule name for GBNF name `n`: kept when it is already one (lowercase letters,
/// digits and `-`, not `start`), else `r-` and the name with each capital as `_` + lower.
fn lark_name(n: &str) -> String {
    let plain = n.starts_with(|c: char| c.is_ascii_lowercase())
        && n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && n != "start";
    if plain {
        return n.to_string();
    }
    let mut s = String::from("r-");
    for c in n.chars() {
        if c.is_ascii_uppercase() {
            s.push('_');
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

fn class_char(c: char) -> String {
    format!("\\x{{{:x}}}", c as u32)
}

/// Translates a GBNF grammar to llguidance's Lark; errors name the GBNF line.
pub fn gbnf_to_lark(src: &str) -> Result<String> {
    let toks = lex(src)?;
    let mut names: HashMap<String, String> = HashMap::new();
    let mut out = String::from("start: root\n");
    let mut i = 0;
    let mut have_root = false;
    while i < toks.len() {
        let (Tok::Name(name), line) = &toks[i] else {
            return Err(err(toks[i].1, "expected a rule name"));
        };
        if toks.get(i + 1).map(|t| &t.0) != Some(&Tok::Define) {
            return Err(err(*line, format!("expected ::= after {name}")));
        }
        let lname = lark_name(name);
        if let Some(prev) = names.insert(lname.clone(), name.clone()) {
            let msg = if &prev == name {
                format!("rule {name} is defined twice")
            } else {
                format!("rules {prev} and {name} have the same Lark name {lname}")
            };
            return Err(err(*line, msg));
        }
        have_root |= name == "root";
        out.push_str(&lname);
        out.push(':');
        i += 2;
        // The body: up to the next `name ::=`.
        let mut empty_alt = true;
        while i < toks.len()
            && !(matches!(toks[i].0, Tok::Name(_)) && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Define))
        {
            let (t, line) = &toks[i];
            let piece = match t {
                Tok::Name(n) => lark_name(n),
                Tok::Define => return Err(err(*line, "unexpected ::=")),
                Tok::Literal(s) => serde_json::to_string(s).map_err(|e| err(*line, e))?,
                Tok::Class(neg, ranges) => {
                    let mut s = String::from(if *neg { "/[^" } else { "/[" });
                    for &(a, b) in ranges {
                        s.push_str(&class_char(a));
                        if b != a {
                            s.push('-');
                            s.push_str(&class_char(b));
                        }
                    }
                    if ranges.is_empty() {
                        return Err(err(*line, "an empty character class"));
                    }
                    s.push_str("]/");
                    s
                }
                Tok::Any => "/(?s:.)/".to_string(),
                Tok::Punct(c) => c.to_string(),
                Tok::Repeat(r) => r.clone(),
            };
            // An empty alternative (`a ::= | "x"`, `( | b)`) becomes the empty string.
            match t {
                Tok::Punct('|') | Tok::Punct(')') if empty_alt => out.push_str(" \"\""),
                _ => {}
            }
            empty_alt = matches!(t, Tok::Punct('|') | Tok::Punct('('));
            out.push(' ');
            out.push_str(&piece);
            i += 1;
        }
        if empty_alt {
            out.push_str(" \"\"");
        }
        out.push('\n');
    }
    if !have_root {
        return Err(Error::Invalid("GBNF: the grammar has no root rule".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_the_parts_of_gbnf() {
        let g = r#"
# a comment
root ::= "{" ws item ("," ws item)* "}"   # trailing comment
item ::= [a-zA-Z_] [^"\\\n]{0,8} | "\u00e9\"" | .
ws ::= | " " | "\n" [ \t]{0,20}
Upper-Case ::= root?
"#;
        let lark = gbnf_to_lark(g).unwrap();
        let want = [
            "start: root",
            r#"root: "{" ws item ( "," ws item ) * "}""#,
            r#"item: /[\x{61}-\x{7a}\x{41}-\x{5a}\x{5f}]/ /[^\x{22}\x{5c}\x{a}]/ {0,8} | "é\"" | /(?s:.)/"#,
            r#"ws: "" | " " | "\n" /[\x{20}\x{9}]/ {0,20}"#,
            "r-_upper-_case: root ?",
        ];
        assert_eq!(lark.lines().collect::<Vec<_>>(), want);
    }

    #[test]
    fn errors_name_the_line() {
        let e = |g: &str| gbnf_to_lark(g).unwrap_err().to_string();
        assert_eq!(e("root ::= \"a\"\nx ::= \"b\nc\""), "GBNF line 2: a line break inside a string");
        assert_eq!(e("item ::= \"a\""), "GBNF: the grammar has no root rule");
        assert_eq!(e("root ::= [z-a]"), "GBNF line 1: empty range 'z'-'a'");
        assert_eq!(e("root ::= \"a\"\nroot ::= \"b\""), "GBNF line 2: rule root is defined twice");
        assert_eq!(e("root ::= <|im_end|>"), "GBNF line 1: token references (<...>) are not supported");
        assert_eq!(e("root ::= \"\\q\""), "GBNF line 1: unknown escape \\q");
        assert_eq!(e("root = \"a\""), "GBNF line 1: unexpected character '='");
        assert_eq!(e("root \"a\""), "GBNF line 1: expected ::= after root");
    }
}
