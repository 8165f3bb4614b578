//! The word rules of a Dockerfile.
//!
//! Two layers, as in BuildKit:
//!
//! - splitting: the parser cuts an instruction's arguments into *raw* words
//!   on unquoted whitespace ([`split_words`]), keeping quotes, escapes and
//!   `$` references exactly as written;
//! - expansion: the builder turns one raw word into its value with the
//!   variables in scope ([`expand`]): quotes removed, escapes applied,
//!   `$NAME` / `${NAME...}` substituted. Unquoted whitespace is kept as is
//!   (a legacy `ENV k a b` value is one word with spaces in it).
//!
//! The escape character is `\` unless the Dockerfile says `` # escape=` ``;
//! the functions take it as a parameter, but for [`expand`] and
//! [`split_words`], which default to `\` (their `_with` variants take it).

use thiserror::Error;

/// The escape character when the Dockerfile sets none.
pub const DEFAULT_ESCAPE: char = '\\';

/// Why a raw word cannot be expanded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WordError {
    #[error("unterminated single quote in {0:?}")]
    UnterminatedSingleQuote(String),
    #[error("unterminated double quote in {0:?}")]
    UnterminatedDoubleQuote(String),
    #[error("missing '}}' in {0:?}")]
    MissingBrace(String),
    #[error("bad substitution in {0:?}")]
    BadSubstitution(String),
    #[error("unsupported modifier {modifier:?} in {word:?} (supported: ${{NAME:-word}}, ${{NAME-word}}, ${{NAME:+word}}, ${{NAME+word}}, ${{NAME:?message}}, ${{NAME?message}})")]
    UnsupportedModifier { word: String, modifier: String },
    /// `${NAME:?message}` / `${NAME?message}` with the variable unset (or empty).
    #[error("{name}: {message}")]
    Required { name: String, message: String },
}

/// Expands one raw word with the default escape character (`\`).
pub fn expand(raw: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, WordError> {
    expand_with(raw, lookup, DEFAULT_ESCAPE)
}

/// Expands one raw word the way BuildKit's shell lexer does for the
/// instructions that take variables: quotes removed, escapes applied and
/// `$` references replaced by `lookup` (unknown names expand to nothing).
pub fn expand_with(raw: &str, lookup: &dyn Fn(&str) -> Option<String>, escape: char) -> Result<String, WordError> {
    Lexer::new(raw, escape, Some(lookup)).word(None)
}

/// Removes quotes and escapes from a raw word but leaves `$` as plain text:
/// for the few values BuildKit unquotes without expanding (flag values such
/// as `--network`, heredoc delimiters).
pub fn unquote_with(raw: &str, escape: char) -> Result<String, WordError> {
    Lexer::new(raw, escape, None).word(None)
}

/// Splits on unquoted whitespace with the default escape character.
pub fn split_words(raw: &str) -> Vec<String> {
    split_words_with(raw, DEFAULT_ESCAPE)
}

/// Splits `raw` into raw words on whitespace outside quotes and not
/// escaped; the words keep their quotes and escapes.
pub fn split_words_with(raw: &str, escape: char) -> Vec<String> {
    let mut words = Vec::new();
    let mut from = 0;
    while let Some((word, end)) = next_word(raw, from, escape) {
        words.push(word);
        from = end;
    }
    words
}

/// Cuts the leading `--name[=value]` words off an instruction's arguments
/// (raw, as BuildKit reads flags before the arguments of any instruction)
/// and returns them with the rest of the text, trimmed. A lone `--` ends
/// the flags and is dropped.
pub fn split_flags(raw: &str, escape: char) -> (Vec<String>, &str) {
    let mut flags = Vec::new();
    let mut from = 0;
    loop {
        let rest = &raw[from..];
        let start = from + (rest.len() - rest.trim_start().len());
        if !raw[start..].starts_with("--") {
            return (flags, raw[start..].trim());
        }
        let Some((word, end)) = next_word(raw, start, escape) else {
            return (flags, "");
        };
        from = end;
        if word == "--" {
            return (flags, raw[from..].trim());
        }
        flags.push(word);
    }
}

/// Splits a raw `key=value` word at its first `=` that is neither quoted
/// nor escaped; both halves stay raw.
pub fn split_key_value(raw: &str, escape: char) -> Option<(&str, &str)> {
    let mut quote: Option<char> = None;
    let mut chars = raw.char_indices();
    while let Some((i, c)) = chars.next() {
        match quote {
            Some(q) if c == q => quote = None,
            // Single quotes escape nothing, not even the escape character.
            Some('\'') => {}
            Some(_) if c == escape => {
                chars.next();
            }
            Some(_) => {}
            None if c == '=' => return Some((&raw[..i], &raw[i + 1..])),
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == escape => {
                chars.next();
            }
            None => {}
        }
    }
    None
}

/// The raw word starting at or after byte `from`, and the byte offset just
/// past it. Mirrors BuildKit's `parseWords`: inside double quotes and
/// outside quotes the escape character keeps the next character in the
/// word (so an escaped space or quote does not split or open a quote); a
/// trailing escape character is dropped.
fn next_word(raw: &str, from: usize, escape: char) -> Option<(String, usize)> {
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut chars = raw[from..].char_indices().map(|(i, c)| (i + from, c)).peekable();
    while let Some(&(i, c)) = chars.peek() {
        if quote.is_none() && c.is_whitespace() {
            if !word.is_empty() {
                return Some((word, i));
            }
            chars.next();
            continue;
        }
        chars.next();
        match quote {
            Some(q) if c == q => quote = None,
            Some(q) if c == escape && q != '\'' => {
                if let Some((_, next)) = chars.next() {
                    word.push(c);
                    word.push(next);
                }
                continue;
            }
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == escape => {
                if let Some((_, next)) = chars.next() {
                    word.push(c);
                    word.push(next);
                }
                continue;
            }
            None => {}
        }
        word.push(c);
    }
    (!word.is_empty()).then_some((word, raw.len()))
}

/// BuildKit's special shell parameters (`$@`, `$?`, ...): a name of their
/// own, which no variable has, so they expand to nothing.
fn is_special_param(c: char) -> bool {
    matches!(c, '@' | '*' | '#' | '?' | '-' | '$' | '!' | '0')
}

/// How the builder looks variables up: the value of a name in scope.
type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// One pass over one raw word.
struct Lexer<'a> {
    raw: &'a str,
    chars: Vec<char>,
    pos: usize,
    escape: char,
    /// `None`: leave `$` alone (see [`unquote_with`]).
    lookup: Option<Lookup<'a>>,
}

impl<'a> Lexer<'a> {
    fn new(raw: &'a str, escape: char, lookup: Option<Lookup<'a>>) -> Self {
        Lexer { raw, chars: raw.chars().collect(), pos: 0, escape, lookup }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        Some(c)
    }

    fn expanding(&self) -> bool {
        self.lookup.is_some()
    }

    /// The word up to the end, or up to `stop` (the `}` closing the word of
    /// `${NAME:-word}`), which is consumed.
    fn word(&mut self, stop: Option<char>) -> Result<String, WordError> {
        let mut out = String::new();
        while let Some(c) = self.peek() {
            if Some(c) == stop {
                self.pos += 1;
                return Ok(out);
            }
            match c {
                '\'' => out.push_str(&self.single_quoted()?),
                '"' => out.push_str(&self.double_quoted()?),
                '$' if self.expanding() => out.push_str(&self.dollar()?),
                _ => {
                    self.pos += 1;
                    if c == self.escape {
                        // Escapes the next character, whatever it is; a
                        // trailing one is dropped.
                        match self.bump() {
                            Some(next) => out.push(next),
                            None => break,
                        }
                    } else {
                        out.push(c);
                    }
                }
            }
        }
        match stop {
            Some(_) => Err(WordError::MissingBrace(self.raw.to_string())),
            None => Ok(out),
        }
    }

    /// `'...'`: every character literal, no escapes at all.
    fn single_quoted(&mut self) -> Result<String, WordError> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            match self.bump() {
                None => return Err(WordError::UnterminatedSingleQuote(self.raw.to_string())),
                Some('\'') => return Ok(out),
                Some(c) => out.push(c),
            }
        }
    }

    /// `"..."`: `$` expands; the escape character escapes only `"`, `$` and
    /// itself, and stays literal before anything else (as in sh).
    fn double_quoted(&mut self) -> Result<String, WordError> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            match self.peek() {
                None => return Err(WordError::UnterminatedDoubleQuote(self.raw.to_string())),
                Some('"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some('$') if self.expanding() => out.push_str(&self.dollar()?),
                Some(c) => {
                    self.pos += 1;
                    if c == self.escape {
                        match self.peek() {
                            Some(next) if next == '"' || next == '$' || next == self.escape => {
                                self.pos += 1;
                                out.push(next);
                            }
                            _ => out.push(c),
                        }
                    } else {
                        out.push(c);
                    }
                }
            }
        }
    }

    /// A `$` reference, the `$` being the current character.
    fn dollar(&mut self) -> Result<String, WordError> {
        self.pos += 1;
        if self.peek() != Some('{') {
            let name = self.name();
            if name.is_empty() {
                // `$` before a non-name character (or at the end) is literal.
                return Ok("$".to_string());
            }
            return Ok(self.value(&name).unwrap_or_default());
        }
        self.pos += 1;
        match self.peek() {
            None => return Err(WordError::MissingBrace(self.raw.to_string())),
            Some('{' | '}' | ':') => return Err(WordError::BadSubstitution(self.raw.to_string())),
            Some(_) => {}
        }
        let name = self.name();
        match self.bump() {
            None => Err(WordError::MissingBrace(self.raw.to_string())),
            Some('}') => Ok(self.value(&name).unwrap_or_default()),
            Some(':') => {
                let op = self.bump().ok_or_else(|| WordError::MissingBrace(self.raw.to_string()))?;
                self.modifier(&name, op, true)
            }
            Some(op) => self.modifier(&name, op, false),
        }
    }

    /// `${NAME<op>word}` (`null_is_unset`: written `${NAME:<op>word}`, an
    /// empty value counts as unset).
    fn modifier(&mut self, name: &str, op: char, null_is_unset: bool) -> Result<String, WordError> {
        if !matches!(op, '-' | '+' | '?') {
            let modifier = if null_is_unset { format!(":{op}") } else { op.to_string() };
            return Err(WordError::UnsupportedModifier { word: self.raw.to_string(), modifier });
        }
        let word = self.word(Some('}'))?;
        let value = self.value(name);
        let unset = match &value {
            None => true,
            Some(v) => null_is_unset && v.is_empty(),
        };
        match op {
            '-' if unset => Ok(word),
            '-' => Ok(value.unwrap_or_default()),
            '+' if unset => Ok(String::new()),
            '+' => Ok(word),
            _ if unset => {
                let message = match (&value, word.is_empty()) {
                    (_, false) => word,
                    (None, true) => "is not allowed to be unset".to_string(),
                    (Some(_), true) => "is not allowed to be empty".to_string(),
                };
                Err(WordError::Required { name: name.to_string(), message })
            }
            _ => Ok(value.unwrap_or_default()),
        }
    }

    /// A variable name: letters, digits and `_`; or a run of digits (the
    /// positional `$1`); or one special parameter character.
    fn name(&mut self) -> String {
        let mut name = String::new();
        match self.peek() {
            Some(c) if c.is_ascii_digit() => {
                while let Some(d) = self.peek().filter(char::is_ascii_digit) {
                    name.push(d);
                    self.pos += 1;
                }
            }
            Some(c) if is_special_param(c) => {
                name.push(c);
                self.pos += 1;
            }
            _ => {
                while let Some(c) = self.peek().filter(|c| c.is_alphanumeric() || *c == '_') {
                    name.push(c);
                    self.pos += 1;
                }
            }
        }
        name
    }

    fn value(&self, name: &str) -> Option<String> {
        self.lookup.and_then(|lookup| lookup(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars() -> HashMap<&'static str, &'static str> {
        HashMap::from([("NAME", "world"), ("EMPTY", ""), ("PATH", "/usr/bin:/bin"), ("SPACED", "a b")])
    }

    fn ex(raw: &str) -> Result<String, WordError> {
        let vars = vars();
        expand(raw, &|name| vars.get(name).map(|v| v.to_string()))
    }

    fn ok(raw: &str) -> String {
        match ex(raw) {
            Ok(s) => s,
            Err(e) => panic!("expanding {raw:?}: {e}"),
        }
    }

    #[test]
    fn plain_words_are_kept() {
        assert_eq!(ok("hello"), "hello");
        assert_eq!(ok("/usr/local/bin/"), "/usr/local/bin/");
        assert_eq!(ok(""), "");
    }

    #[test]
    fn unquoted_whitespace_is_kept() {
        assert_eq!(ok("a b  c"), "a b  c");
    }

    #[test]
    fn simple_references() {
        assert_eq!(ok("$NAME"), "world");
        assert_eq!(ok("${NAME}"), "world");
        assert_eq!(ok("hello-$NAME-again"), "hello-world-again");
        assert_eq!(ok("${NAME}s"), "worlds");
        assert_eq!(ok("$NAMEs"), "");
        assert_eq!(ok("$PATH:/opt/bin"), "/usr/bin:/bin:/opt/bin");
    }

    #[test]
    fn unknown_variables_expand_to_nothing() {
        assert_eq!(ok("a${NOPE}b"), "ab");
        assert_eq!(ok("a$NOPE"), "a");
    }

    #[test]
    fn dollar_before_a_non_name_character_is_literal() {
        assert_eq!(ok("$"), "$");
        assert_eq!(ok("a$"), "a$");
        assert_eq!(ok("$/x"), "$/x");
        assert_eq!(ok("cost: $ 5"), "cost: $ 5");
        assert_eq!(ok("\"$\""), "$");
        assert_eq!(ok("$%"), "$%");
    }

    #[test]
    fn special_and_positional_parameters_expand_to_nothing() {
        // As BuildKit: they are names of their own, which nothing defines.
        assert_eq!(ok("a$$b"), "ab");
        assert_eq!(ok("$1x"), "x");
        assert_eq!(ok("$12"), "");
        assert_eq!(ok("$@"), "");
    }

    #[test]
    fn default_values() {
        assert_eq!(ok("${NOPE:-fallback}"), "fallback");
        assert_eq!(ok("${NOPE-fallback}"), "fallback");
        assert_eq!(ok("${EMPTY:-fallback}"), "fallback");
        assert_eq!(ok("${EMPTY-fallback}"), "");
        assert_eq!(ok("${NAME:-fallback}"), "world");
        assert_eq!(ok("${NAME-fallback}"), "world");
        assert_eq!(ok("${NOPE:-}"), "");
    }

    #[test]
    fn alternative_values() {
        assert_eq!(ok("${NAME:+set}"), "set");
        assert_eq!(ok("${NAME+set}"), "set");
        assert_eq!(ok("${EMPTY:+set}"), "");
        assert_eq!(ok("${EMPTY+set}"), "set");
        assert_eq!(ok("${NOPE:+set}"), "");
        assert_eq!(ok("${NOPE+set}"), "");
    }

    #[test]
    fn modifier_words_are_words_themselves() {
        assert_eq!(ok("${NOPE:-$NAME}"), "world");
        assert_eq!(ok("${NOPE:-${EMPTY:-deep}}"), "deep");
        assert_eq!(ok("${NOPE:-\"a }\"}"), "a }");
        assert_eq!(ok("${NOPE:-a\\}b}"), "a}b");
        assert_eq!(ok("${NOPE:-'x y'}"), "x y");
        assert_eq!(ok("pre${NOPE:-mid}post"), "premidpost");
    }

    #[test]
    fn required_values() {
        assert_eq!(ok("${NAME:?must be set}"), "world");
        assert_eq!(ok("${EMPTY?must be set}"), "");
        assert_eq!(ex("${NOPE:?must be set}"), Err(WordError::Required { name: "NOPE".into(), message: "must be set".into() }));
        assert_eq!(ex("${NOPE?}"), Err(WordError::Required { name: "NOPE".into(), message: "is not allowed to be unset".into() }));
        assert_eq!(ex("${EMPTY:?}"), Err(WordError::Required { name: "EMPTY".into(), message: "is not allowed to be empty".into() }));
        assert_eq!(ex("${NOPE:?gone}").map_err(|e| e.to_string()), Err("NOPE: gone".to_string()));
    }

    #[test]
    fn double_quotes() {
        assert_eq!(ok("\"hello $NAME\""), "hello world");
        assert_eq!(ok("\"a b\""), "a b");
        assert_eq!(ok("\"it's\""), "it's");
        assert_eq!(ok("\"\""), "");
        assert_eq!(ok("x\"y\"z"), "xyz");
        assert_eq!(ok("\"${NAME}\""), "world");
    }

    #[test]
    fn escapes_inside_double_quotes() {
        assert_eq!(ok(r#""say \"hi\"""#), "say \"hi\"");
        assert_eq!(ok(r#""\$NAME""#), "$NAME");
        assert_eq!(ok(r#""a\\b""#), "a\\b");
        // Any other escaped character keeps its backslash, as in sh.
        assert_eq!(ok(r#""a\nb""#), "a\\nb");
        assert_eq!(ok(r#""C:\dir""#), "C:\\dir");
    }

    #[test]
    fn single_quotes_are_literal() {
        assert_eq!(ok("'$NAME'"), "$NAME");
        assert_eq!(ok("'a \\ b'"), "a \\ b");
        assert_eq!(ok("'\"'"), "\"");
        assert_eq!(ok("'it'\\''s'"), "it's");
    }

    #[test]
    fn escapes_outside_quotes() {
        assert_eq!(ok("\\$NAME"), "$NAME");
        assert_eq!(ok("a\\ b"), "a b");
        assert_eq!(ok("\\\"x\\\""), "\"x\"");
        assert_eq!(ok("\\\\"), "\\");
        assert_eq!(ok("a\\nb"), "anb");
        // A trailing escape character is dropped.
        assert_eq!(ok("abc\\"), "abc");
    }

    #[test]
    fn variable_values_are_not_reprocessed() {
        let lookup = |name: &str| (name == "V").then(|| "'$X' \"q\"".to_string());
        assert_eq!(expand("$V", &lookup), Ok("'$X' \"q\"".to_string()));
        assert_eq!(expand("\"$V\"", &lookup), Ok("'$X' \"q\"".to_string()));
    }

    #[test]
    fn values_with_spaces_stay_one_word() {
        assert_eq!(ok("$SPACED"), "a b");
    }

    #[test]
    fn syntax_errors() {
        assert!(matches!(ex("\"open"), Err(WordError::UnterminatedDoubleQuote(_))));
        assert!(matches!(ex("'open"), Err(WordError::UnterminatedSingleQuote(_))));
        assert!(matches!(ex("${NAME"), Err(WordError::MissingBrace(_))));
        assert!(matches!(ex("${"), Err(WordError::MissingBrace(_))));
        assert!(matches!(ex("${NOPE:-abc"), Err(WordError::MissingBrace(_))));
        assert!(matches!(ex("${NOPE:"), Err(WordError::MissingBrace(_))));
        assert!(matches!(ex("${}"), Err(WordError::BadSubstitution(_))));
        assert!(matches!(ex("${:-x}"), Err(WordError::BadSubstitution(_))));
        assert!(matches!(ex("${{x}}"), Err(WordError::BadSubstitution(_))));
    }

    #[test]
    fn unsupported_modifiers() {
        for raw in ["${NAME#w}", "${NAME%d}", "${NAME/w/W}", "${NAME:=x}", "${NAME=x}", "${NAME x}"] {
            assert!(matches!(ex(raw), Err(WordError::UnsupportedModifier { .. })), "{raw}");
        }
        let message = ex("${NAME:=x}").map_err(|e| e.to_string()).err().unwrap_or_default();
        assert!(message.contains("\":=\""), "{message}");
    }

    #[test]
    fn backtick_escape() {
        let vars = vars();
        let lookup = |name: &str| vars.get(name).map(|v| v.to_string());
        assert_eq!(expand_with("C:\\dir\\$NAME", &lookup, '`'), Ok("C:\\dir\\world".to_string()));
        assert_eq!(expand_with("`$NAME", &lookup, '`'), Ok("$NAME".to_string()));
        assert_eq!(expand_with("\"a`\"b\"", &lookup, '`'), Ok("a\"b".to_string()));
        assert_eq!(expand_with("\"a\\\"", &lookup, '`'), Ok("a\\".to_string()));
    }

    #[test]
    fn unquote_leaves_dollars() {
        assert_eq!(unquote_with("\"$X\"", '\\'), Ok("$X".to_string()));
        assert_eq!(unquote_with("'none'", '\\'), Ok("none".to_string()));
        assert_eq!(unquote_with("${A:-b}", '\\'), Ok("${A:-b}".to_string()));
        assert!(unquote_with("\"x", '\\').is_err());
    }

    #[test]
    fn splitting_on_unquoted_whitespace() {
        assert_eq!(split_words("a b\tc"), ["a", "b", "c"]);
        assert_eq!(split_words("  lead  trail  "), ["lead", "trail"]);
        assert_eq!(split_words(""), Vec::<String>::new());
        assert_eq!(split_words("   "), Vec::<String>::new());
    }

    #[test]
    fn splitting_keeps_quotes_and_escapes() {
        assert_eq!(split_words(r#"k="a b" x='c d' e"#), [r#"k="a b""#, "x='c d'", "e"]);
        assert_eq!(split_words(r"my\ file /dst"), [r"my\ file", "/dst"]);
        assert_eq!(split_words(r#"a\"b c"#), [r#"a\"b"#, "c"]);
        assert_eq!(split_words(r#""a \" b" c"#), [r#""a \" b""#, "c"]);
        assert_eq!(split_words("'a \\' b"), ["'a \\'", "b"]);
        assert_eq!(split_words("$HOME ${X:-a b}"), ["$HOME", "${X:-a", "b}"]);
        assert_eq!(split_words("\"\" x"), ["\"\"", "x"]);
    }

    #[test]
    fn splitting_drops_a_trailing_escape() {
        assert_eq!(split_words("a \\"), ["a"]);
        assert_eq!(split_words("a\\"), ["a"]);
    }

    #[test]
    fn splitting_with_backtick_escape() {
        assert_eq!(split_words_with("C:\\a b`  c", '`'), ["C:\\a", "b` ", "c"]);
    }

    #[test]
    fn splitting_unicode() {
        assert_eq!(split_words("héllo wörld \"ü ö\""), ["héllo", "wörld", "\"ü ö\""]);
    }

    #[test]
    fn flags_are_cut_off() {
        let (flags, rest) = split_flags("--from=build --chown=\"a b\" /src /dst", '\\');
        assert_eq!(flags, ["--from=build", "--chown=\"a b\""]);
        assert_eq!(rest, "/src /dst");
    }

    #[test]
    fn flags_stop_at_the_first_other_word() {
        let (flags, rest) = split_flags("  --network=none  apt-get install --yes ", '\\');
        assert_eq!(flags, ["--network=none"]);
        assert_eq!(rest, "apt-get install --yes");
        let (flags, rest) = split_flags("echo --x", '\\');
        assert!(flags.is_empty());
        assert_eq!(rest, "echo --x");
        let (flags, rest) = split_flags("[\"a\"]", '\\');
        assert!(flags.is_empty());
        assert_eq!(rest, "[\"a\"]");
    }

    #[test]
    fn double_dash_ends_flags() {
        let (flags, rest) = split_flags("--network=host -- --not-a-flag", '\\');
        assert_eq!(flags, ["--network=host"]);
        assert_eq!(rest, "--not-a-flag");
    }

    #[test]
    fn only_flags() {
        let (flags, rest) = split_flags("--a --b=c", '\\');
        assert_eq!(flags, ["--a", "--b=c"]);
        assert_eq!(rest, "");
        let (flags, rest) = split_flags("", '\\');
        assert!(flags.is_empty());
        assert_eq!(rest, "");
    }

    #[test]
    fn key_value_split() {
        assert_eq!(split_key_value("k=v", '\\'), Some(("k", "v")));
        assert_eq!(split_key_value("k=", '\\'), Some(("k", "")));
        assert_eq!(split_key_value("k=a=b", '\\'), Some(("k", "a=b")));
        assert_eq!(split_key_value("\"a=b\"=c", '\\'), Some(("\"a=b\"", "c")));
        assert_eq!(split_key_value("'a=b'=c", '\\'), Some(("'a=b'", "c")));
        assert_eq!(split_key_value("a\\=b=c", '\\'), Some(("a\\=b", "c")));
        assert_eq!(split_key_value("k=\"a b\"", '\\'), Some(("k", "\"a b\"")));
        assert_eq!(split_key_value("novalue", '\\'), None);
        assert_eq!(split_key_value("\"x=y\"", '\\'), None);
        assert_eq!(split_key_value("=v", '\\'), Some(("", "v")));
    }
}
