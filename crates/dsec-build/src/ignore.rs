//! `.dockerignore` rules, as Docker and BuildKit apply them, and the
//! wildcard matcher of `COPY` sources ([`glob_match`]).
//!
//! A rule file holds one pattern a line: `#` at the very start of a line
//! makes a comment, blank lines are skipped, `!` makes an exception that
//! re-includes what earlier patterns excluded. Patterns are cleaned like
//! Go's `filepath.Clean` and have any leading `/` stripped, so `/foo/`,
//! `foo/` and `./foo` are all `foo`.
//!
//! Matching follows Go's `filepath.Match` (`*` and `?` never cross a `/`,
//! `[...]` classes, `\` escapes), plus `**`, which matches any number of
//! directories (zero included). A pattern excludes a path when it matches
//! the path or one of its parent directories; the last pattern that does
//! decides.

/// The parsed rules of a `.dockerignore`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IgnoreRules {
    patterns: Vec<Pattern>,
    /// Lines Docker would refuse (bad `[...]`, trailing `\`, a lone `!`):
    /// they never match.
    invalid: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    /// `!` line: re-includes.
    exception: bool,
    tokens: Vec<Token>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    /// `?`: one character but `/`.
    AnyChar,
    /// `*`: any run of characters without `/`.
    Star,
    /// `**` at the end, or before something else than `/`: anything.
    AnyText,
    /// `**/`: nothing, or anything that ends with `/` (whole directories).
    AnyDirs,
    Class(Class),
}

/// `[...]` / `[^...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Class {
    negated: bool,
    ranges: Vec<(char, char)>,
}

impl Class {
    fn matches(&self, c: char) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != self.negated
    }
}

/// Parses the text of a `.dockerignore`.
pub fn parse(text: &str) -> IgnoreRules {
    let mut rules = IgnoreRules::default();
    for (index, line) in text.lines().enumerate() {
        let line = if index == 0 { line.strip_prefix('\u{feff}').unwrap_or(line) } else { line };
        // Docker only takes `#` in the first column as a comment.
        if line.starts_with('#') {
            continue;
        }
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match compile_rule(line) {
            Some(pattern) => rules.patterns.push(pattern),
            None => rules.invalid.push(line.to_string()),
        }
    }
    rules
}

/// One non-comment line: `[!]pattern`.
fn compile_rule(line: &str) -> Option<Pattern> {
    let (exception, body) = match line.strip_prefix('!') {
        Some(rest) => (true, rest.trim()),
        None => (false, line),
    };
    if body.is_empty() {
        return None;
    }
    let cleaned = clean(body);
    // The context root is `/`: an absolute pattern is relative to it.
    let cleaned = match cleaned.strip_prefix('/') {
        Some(rest) if !rest.is_empty() => rest.to_string(),
        _ => cleaned,
    };
    let tokens = compile(&cleaned, true)?;
    Some(Pattern { exception, tokens })
}

impl IgnoreRules {
    /// No pattern at all (no `.dockerignore`, or only comments).
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The lines that are not valid patterns (Docker refuses them; here
    /// they match nothing), for the builder to warn about.
    pub fn invalid_patterns(&self) -> &[String] {
        &self.invalid
    }

    /// Whether `rel_path` ('/'-separated, relative to the context root) is
    /// left out of the context: the last pattern matching it or one of its
    /// parent directories is not an exception. The root itself never is.
    pub fn is_excluded(&self, rel_path: &str) -> bool {
        let Some(path) = normalize(rel_path) else {
            return false;
        };
        let path: Vec<char> = path.chars().collect();
        let parents: Vec<usize> = path.iter().enumerate().filter(|(_, c)| **c == '/').map(|(i, _)| i).collect();
        let mut excluded = false;
        for pattern in &self.patterns {
            // Only a pattern of the other kind can change the verdict.
            if pattern.exception != excluded {
                continue;
            }
            let hit = matches(&pattern.tokens, &path) || parents.iter().any(|&end| matches(&pattern.tokens, &path[..end]));
            if hit {
                excluded = !pattern.exception;
            }
        }
        excluded
    }

    /// Whether something below the directory `dir_rel_path` may still be in
    /// the context, so a walker must descend into it even though it is
    /// excluded: true when an exception pattern could match a path below
    /// it (`!dir/keep`, `!**/*.md`), and true for a directory that is not
    /// excluded at all. False means everything below is excluded.
    pub fn may_contain_included(&self, dir_rel_path: &str) -> bool {
        let Some(dir) = normalize(dir_rel_path) else {
            return true;
        };
        if !self.is_excluded(&dir) {
            return true;
        }
        let mut prefix: Vec<char> = dir.chars().collect();
        prefix.push('/');
        self.patterns.iter().any(|p| p.exception && could_match_below(&p.tokens, &prefix))
    }
}

/// The path cleaned and made relative; `None` for the context root.
fn normalize(rel_path: &str) -> Option<String> {
    let cleaned = clean(rel_path);
    let relative = cleaned.trim_start_matches('/');
    (!relative.is_empty() && relative != ".").then(|| relative.to_string())
}

/// Go's `filepath.Match` on '/'-separated paths: `*` (no `/`), `?` (one
/// character but `/`), `[...]` / `[^...]` with ranges, `\` escaping the
/// next character. A malformed pattern matches nothing. `**` is no more
/// than `*` here, as in Go.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    let Some(tokens) = compile(pattern, false) else {
        return false;
    };
    let path: Vec<char> = path.chars().collect();
    matches(&tokens, &path)
}

/// Whether `pattern` is well-formed for [`glob_match`] (Go would return
/// `ErrBadPattern` otherwise).
pub fn is_valid_glob(pattern: &str) -> bool {
    compile(pattern, false).is_some()
}

/// Whether a `COPY` source holds wildcards (`*`, `?`, `[`) that are not
/// escaped with `\`, i.e. must go through [`glob_match`] rather than be
/// taken as a plain path.
pub fn has_wildcards(path: &str) -> bool {
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '*' | '?' | '[' => return true,
            _ => {}
        }
    }
    false
}

/// Go's `filepath.Clean` for '/'-separated paths: no repeated `/`, no `.`
/// elements, `..` folded into what precedes it (and dropped at the root),
/// no trailing `/`; `.` for an empty result.
pub fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => match parts.last() {
                Some(&last) if last != ".." => {
                    parts.pop();
                }
                _ if rooted => {}
                _ => parts.push(".."),
            },
            _ => parts.push(part),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

/// Compiles a pattern; `None` when malformed. `double_star`: `**` has the
/// `.dockerignore` meaning (else it is two `*`, as in Go).
fn compile(pattern: &str, double_star: bool) -> Option<Vec<Token>> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        match c {
            '*' if double_star && chars.get(i) == Some(&'*') => {
                i += 1;
                if chars.get(i) == Some(&'/') && i + 1 < chars.len() {
                    i += 1;
                    tokens.push(Token::AnyDirs);
                } else {
                    // `**` at the end (or `**/` at the end) takes anything.
                    if chars.get(i) == Some(&'/') {
                        i += 1;
                    }
                    tokens.push(Token::AnyText);
                }
            }
            '*' => tokens.push(Token::Star),
            '?' => tokens.push(Token::AnyChar),
            '[' => {
                let (class, next) = compile_class(&chars, i)?;
                tokens.push(Token::Class(class));
                i = next;
            }
            '\\' => {
                let escaped = *chars.get(i)?;
                i += 1;
                tokens.push(Token::Literal(escaped));
            }
            _ => tokens.push(Token::Literal(c)),
        }
    }
    Some(tokens)
}

/// The class whose `[` is just before `start`, and the index after its `]`.
/// As Go: non-empty, `-` and `]` must be escaped inside, `^` negates.
fn compile_class(chars: &[char], start: usize) -> Option<(Class, usize)> {
    let mut i = start;
    let negated = chars.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    loop {
        if chars.get(i) == Some(&']') && !ranges.is_empty() {
            return Some((Class { negated, ranges }, i + 1));
        }
        let (lo, next) = class_char(chars, i)?;
        i = next;
        let mut hi = lo;
        if chars.get(i) == Some(&'-') {
            let (end, next) = class_char(chars, i + 1)?;
            hi = end;
            i = next;
        }
        ranges.push((lo, hi));
    }
}

/// One character of a class, maybe escaped; fails at the end of the
/// pattern (unclosed class) and on a bare `-` or `]`.
fn class_char(chars: &[char], i: usize) -> Option<(char, usize)> {
    let (c, next) = match *chars.get(i)? {
        '-' | ']' => return None,
        '\\' => (*chars.get(i + 1)?, i + 2),
        c => (c, i + 1),
    };
    // Something must follow: at least the closing `]`.
    (next < chars.len()).then_some((c, next))
}

/// Whether the tokens match the whole of `path`.
fn matches(tokens: &[Token], path: &[char]) -> bool {
    Matcher::new(tokens, path, false).at(0, 0)
}

/// Whether the tokens could match some path that starts with `prefix`
/// (which ends with `/`): they do not fail before the prefix is used up.
/// Errs on the side of yes.
fn could_match_below(tokens: &[Token], prefix: &[char]) -> bool {
    Matcher::new(tokens, prefix, true).at(0, 0)
}

/// Matching by memoised recursion over (token, position): linear in the
/// pattern times quadratic in the path at worst, with no exponential
/// blow-up on patterns like `*a*a*a*b`.
struct Matcher<'a> {
    tokens: &'a [Token],
    text: &'a [char],
    /// `text` is a prefix: reaching its end is a success.
    prefix: bool,
    memo: Vec<Option<bool>>,
}

impl<'a> Matcher<'a> {
    fn new(tokens: &'a [Token], text: &'a [char], prefix: bool) -> Self {
        Matcher { tokens, text, prefix, memo: vec![None; (tokens.len() + 1) * (text.len() + 1)] }
    }

    /// Whether `tokens[ti..]` match `text[pi..]`.
    fn at(&mut self, ti: usize, pi: usize) -> bool {
        let key = ti * (self.text.len() + 1) + pi;
        if let Some(known) = self.memo[key] {
            return known;
        }
        let result = self.compute(ti, pi);
        self.memo[key] = Some(result);
        result
    }

    fn compute(&mut self, ti: usize, pi: usize) -> bool {
        let n = self.text.len();
        if pi == n && self.prefix {
            return true;
        }
        let Some(token) = self.tokens.get(ti) else {
            return pi == n;
        };
        let current = self.text.get(pi).copied();
        match token {
            Token::Literal(c) => current == Some(*c) && self.at(ti + 1, pi + 1),
            Token::AnyChar => current.is_some_and(|c| c != '/') && self.at(ti + 1, pi + 1),
            Token::Class(class) => current.is_some_and(|c| class.matches(c)) && self.at(ti + 1, pi + 1),
            Token::Star => {
                let mut end = pi;
                loop {
                    if self.at(ti + 1, end) {
                        return true;
                    }
                    if end == n || self.text[end] == '/' {
                        return false;
                    }
                    end += 1;
                }
            }
            Token::AnyText => (pi..=n).any(|end| self.at(ti + 1, end)),
            Token::AnyDirs => self.at(ti + 1, pi) || (pi..n).any(|k| self.text[k] == '/' && self.at(ti + 1, k + 1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn excluded(rules: &str, path: &str) -> bool {
        parse(rules).is_excluded(path)
    }

    #[test]
    fn go_match_basics() {
        assert!(glob_match("abc", "abc"));
        assert!(!glob_match("abc", "abd"));
        assert!(glob_match("*", "abc"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("*", "a/b"));
        assert!(glob_match("*c", "abc"));
        assert!(glob_match("a*", "a"));
        assert!(glob_match("a*/b", "abc/b"));
        assert!(!glob_match("a*/b", "a/c/b"));
        assert!(glob_match("a*b*c*d*e*/f", "axbxcxdxe/f"));
        assert!(glob_match("a*b*c*d*e*/f", "axbxcxdxexxx/f"));
        assert!(!glob_match("a*b*c*d*e*/f", "axbxcxdxe/xxx/f"));
        assert!(!glob_match("a*b*c*d*e*/f", "axbxcxdxexxx/fff"));
        assert!(glob_match("a*b?c*x", "abxbbxdbxebxczzx"));
        assert!(!glob_match("a*b?c*x", "abxbbxdbxebxczzy"));
        assert!(glob_match("*.txt", "notes.txt"));
        assert!(!glob_match("*.txt", "dir/notes.txt"));
        assert!(glob_match("dir/*.txt", "dir/notes.txt"));
    }

    #[test]
    fn go_match_question_mark() {
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "a/c"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("?", "é"));
    }

    #[test]
    fn go_match_classes() {
        assert!(glob_match("ab[c]", "abc"));
        assert!(glob_match("ab[b-d]", "abc"));
        assert!(!glob_match("ab[e-g]", "abc"));
        assert!(!glob_match("ab[^c]", "abc"));
        assert!(!glob_match("ab[^b-d]", "abc"));
        assert!(glob_match("ab[^e-g]", "abc"));
        assert!(glob_match("a[^a]b", "a☺b"));
        assert!(glob_match("a[a-ζ]b", "aαb"));
        assert!(glob_match("[\\]a]", "]"));
        assert!(glob_match("[\\-]", "-"));
        assert!(glob_match("[x\\-]", "x"));
        assert!(glob_match("[x\\-]", "-"));
        assert!(!glob_match("[x\\-]", "z"));
        assert!(glob_match("[a-c][0-9]", "b7"));
        assert!(glob_match("file.[ch]", "file.h"));
    }

    #[test]
    fn go_match_escapes() {
        assert!(glob_match("a\\*b", "a*b"));
        assert!(!glob_match("a\\*b", "ab"));
        assert!(glob_match("\\[x\\]", "[x]"));
        assert!(glob_match("a\\?", "a?"));
    }

    #[test]
    fn go_match_bad_patterns_match_nothing() {
        for bad in ["[", "[^", "[^bc", "a[", "[]a]", "[-]", "[x-]", "[-x]", "\\", "a\\", "[a-b-c]", "[\\", "[a-"] {
            assert!(!glob_match(bad, "a"), "{bad}");
            assert!(!is_valid_glob(bad), "{bad}");
        }
        assert!(is_valid_glob("a*[b-c]?\\*"));
    }

    #[test]
    fn go_match_double_star_is_a_star() {
        assert!(glob_match("**", "abc"));
        assert!(!glob_match("**", "a/b"));
        assert!(!glob_match("a/**/b", "a/x/y/b"));
    }

    #[test]
    fn wildcard_detection() {
        assert!(has_wildcards("*.go"));
        assert!(has_wildcards("a?"));
        assert!(has_wildcards("[ab]"));
        assert!(!has_wildcards("src/main.rs"));
        assert!(!has_wildcards("a\\*b"));
        assert!(has_wildcards("a\\*b*"));
    }

    #[test]
    fn cleaning_like_go() {
        assert_eq!(clean(""), ".");
        assert_eq!(clean("."), ".");
        assert_eq!(clean("./"), ".");
        assert_eq!(clean("a/"), "a");
        assert_eq!(clean("a//b"), "a/b");
        assert_eq!(clean("./a/./b/"), "a/b");
        assert_eq!(clean("a/../b"), "b");
        assert_eq!(clean("a/b/../.."), ".");
        assert_eq!(clean("../a"), "../a");
        assert_eq!(clean("a/../../b"), "../b");
        assert_eq!(clean("/"), "/");
        assert_eq!(clean("/../a"), "/a");
        assert_eq!(clean("//a//b//"), "/a/b");
        assert_eq!(clean("/a/b/.."), "/a");
    }

    #[test]
    fn comments_and_blank_lines() {
        let rules = parse("# a comment\n\n   \nnode_modules\n#not-a-pattern\n");
        assert_eq!(rules.patterns.len(), 1);
        assert!(rules.is_excluded("node_modules"));
        assert!(!rules.is_excluded("#not-a-pattern"));
        assert!(parse("# only\n\n").is_empty());
    }

    #[test]
    fn hash_after_whitespace_is_a_pattern() {
        // As Docker: only a `#` in the first column starts a comment.
        assert!(excluded("  #weird", "#weird"));
    }

    #[test]
    fn patterns_are_cleaned() {
        for rule in ["foo", "/foo", "foo/", "./foo", "/foo/", "foo/.", "bar/../foo", "  foo  "] {
            assert!(excluded(rule, "foo"), "{rule}");
            assert!(excluded(rule, "foo/bar"), "{rule}");
            assert!(!excluded(rule, "xfoo"), "{rule}");
        }
    }

    #[test]
    fn crlf_and_bom() {
        let rules = parse("\u{feff}target\r\n*.log\r\n");
        assert!(rules.is_excluded("target"));
        assert!(rules.is_excluded("debug.log"));
    }

    #[test]
    fn excluding_a_directory_excludes_its_contents() {
        let rules = parse(".git\nnode_modules\n");
        assert!(rules.is_excluded(".git"));
        assert!(rules.is_excluded(".git/config"));
        assert!(rules.is_excluded(".git/objects/ab/cdef"));
        assert!(rules.is_excluded("node_modules/pkg/index.js"));
        assert!(!rules.is_excluded("src/node_modules"));
        assert!(!rules.is_excluded(".github/workflows/ci.yml"));
        assert!(!rules.is_excluded("src/main.rs"));
    }

    #[test]
    fn star_stays_in_one_directory() {
        let rules = parse("*.pyc\ndocs/*.md\n");
        assert!(rules.is_excluded("a.pyc"));
        assert!(!rules.is_excluded("pkg/a.pyc"));
        assert!(rules.is_excluded("docs/readme.md"));
        assert!(!rules.is_excluded("docs/sub/readme.md"));
        assert!(!rules.is_excluded("readme.md"));
    }

    #[test]
    fn star_matches_top_level_directories() {
        let rules = parse("*/temp*\n");
        assert!(rules.is_excluded("somedir/temporary.txt"));
        assert!(rules.is_excluded("somedir/temp"));
        assert!(rules.is_excluded("somedir/temp/inner"));
        assert!(!rules.is_excluded("temp"));
        assert!(!rules.is_excluded("a/b/temp"));
    }

    #[test]
    fn double_star_crosses_directories() {
        let rules = parse("**/*.go\n");
        assert!(rules.is_excluded("main.go"));
        assert!(rules.is_excluded("a/main.go"));
        assert!(rules.is_excluded("a/b/c/main.go"));
        assert!(!rules.is_excluded("main.rs"));

        let rules = parse("**/__pycache__\n");
        assert!(rules.is_excluded("__pycache__"));
        assert!(rules.is_excluded("pkg/__pycache__"));
        assert!(rules.is_excluded("pkg/__pycache__/mod.pyc"));
        assert!(!rules.is_excluded("pkg/x__pycache__"));

        let rules = parse("a/**/b\n");
        assert!(rules.is_excluded("a/b"));
        assert!(rules.is_excluded("a/x/b"));
        assert!(rules.is_excluded("a/x/y/b"));
        assert!(rules.is_excluded("a/x/y/b/file"));
        assert!(!rules.is_excluded("a/xb"));
        assert!(!rules.is_excluded("b"));
    }

    #[test]
    fn trailing_double_star() {
        let rules = parse("build/**\n");
        assert!(rules.is_excluded("build/out"));
        assert!(rules.is_excluded("build/a/b"));
        // Not the directory itself, only what is in it.
        assert!(!rules.is_excluded("build"));
        assert!(!rules.is_excluded("builder"));

        let all = parse("**\n");
        assert!(all.is_excluded("anything"));
        assert!(all.is_excluded("a/b/c"));
    }

    #[test]
    fn double_star_inside_a_name() {
        let rules = parse("**.log\n");
        assert!(rules.is_excluded("x.log"));
        assert!(rules.is_excluded("a/b/x.log"));
        assert!(!rules.is_excluded("x.txt"));
    }

    #[test]
    fn exceptions_reinclude() {
        let rules = parse("*.md\n!README.md\n");
        assert!(rules.is_excluded("CHANGES.md"));
        assert!(!rules.is_excluded("README.md"));
    }

    #[test]
    fn the_last_matching_pattern_wins() {
        let rules = parse("*.md\n!README*.md\nREADME-secret.md\n");
        assert!(rules.is_excluded("CHANGES.md"));
        assert!(!rules.is_excluded("README.md"));
        assert!(!rules.is_excluded("README-public.md"));
        assert!(rules.is_excluded("README-secret.md"));
    }

    #[test]
    fn exceptions_inside_an_excluded_directory() {
        let rules = parse("vendor\n!vendor/keep\n");
        assert!(rules.is_excluded("vendor"));
        assert!(rules.is_excluded("vendor/other"));
        assert!(!rules.is_excluded("vendor/keep"));
        assert!(!rules.is_excluded("vendor/keep/file.txt"));
    }

    #[test]
    fn exclude_everything_but() {
        let rules = parse("*\n!src\n!Cargo.toml\n");
        assert!(rules.is_excluded("target"));
        assert!(rules.is_excluded("target/debug/app"));
        assert!(rules.is_excluded("README.md"));
        assert!(!rules.is_excluded("src"));
        assert!(!rules.is_excluded("src/main.rs"));
        assert!(!rules.is_excluded("Cargo.toml"));
    }

    #[test]
    fn exception_with_leading_slash_and_spaces() {
        let rules = parse("logs\n!  /logs/keep.log\n");
        assert!(!rules.is_excluded("logs/keep.log"));
        assert!(rules.is_excluded("logs/other.log"));
    }

    #[test]
    fn exception_order_matters() {
        // An exception before the exclusion it would undo does nothing.
        let rules = parse("!keep.txt\n*.txt\n");
        assert!(rules.is_excluded("keep.txt"));
    }

    #[test]
    fn paths_are_normalized() {
        let rules = parse("foo/bar\n");
        assert!(rules.is_excluded("./foo/bar"));
        assert!(rules.is_excluded("foo/bar/"));
        assert!(rules.is_excluded("/foo/bar"));
        assert!(rules.is_excluded("foo//bar"));
    }

    #[test]
    fn the_root_is_never_excluded() {
        let rules = parse("*\n**\n.\n");
        assert!(!rules.is_excluded(""));
        assert!(!rules.is_excluded("."));
        assert!(!rules.is_excluded("/"));
        assert!(rules.may_contain_included(""));
    }

    #[test]
    fn escapes_and_classes_in_patterns() {
        let rules = parse("file\\[1\\].txt\nlog[0-9]\n");
        assert!(rules.is_excluded("file[1].txt"));
        assert!(!rules.is_excluded("file1.txt"));
        assert!(rules.is_excluded("log7"));
        assert!(!rules.is_excluded("logx"));
    }

    #[test]
    fn invalid_patterns_are_reported_and_match_nothing() {
        let rules = parse("[\n!\nok\nbad\\\n");
        assert_eq!(rules.invalid_patterns(), ["[", "!", "bad\\"]);
        assert!(rules.is_excluded("ok"));
        assert!(!rules.is_excluded("["));
        assert!(!rules.is_excluded("bad\\"));
    }

    #[test]
    fn empty_rules_exclude_nothing() {
        let rules = parse("");
        assert!(rules.is_empty());
        assert!(!rules.is_excluded("a"));
        assert!(rules.may_contain_included("a"));
    }

    #[test]
    fn descending_into_excluded_directories() {
        let rules = parse("vendor\n!vendor/keep\n");
        assert!(rules.may_contain_included("vendor"));
        assert!(rules.may_contain_included("vendor/keep"));

        let rules = parse("node_modules\n");
        assert!(!rules.may_contain_included("node_modules"));
        assert!(!rules.may_contain_included("node_modules/pkg"));
        // Not excluded: of course there may be something in it.
        assert!(rules.may_contain_included("src"));

        let rules = parse("docs\n!README.md\n");
        assert!(!rules.may_contain_included("docs"));
    }

    #[test]
    fn descending_for_wildcard_exceptions() {
        let rules = parse("*\n!**/*.md\n");
        assert!(rules.may_contain_included("any"));
        assert!(rules.may_contain_included("any/deeper"));

        let rules = parse("*\n!*/keep\n");
        assert!(rules.may_contain_included("a"));
        assert!(!rules.may_contain_included("a/b"));

        let rules = parse("build\nlogs\n!build/*/out\n");
        assert!(rules.may_contain_included("build"));
        assert!(rules.may_contain_included("build/x"));
        assert!(!rules.may_contain_included("build/x/y"));
        assert!(!rules.may_contain_included("logs"));
    }

    #[test]
    fn descending_into_a_directory_whose_name_prefixes_an_exception() {
        let rules = parse("a\n!ab/c\n");
        assert!(!rules.may_contain_included("a"));
    }

    #[test]
    fn many_stars_do_not_blow_up() {
        let path = "a".repeat(200);
        assert!(!glob_match("*a*a*a*a*a*a*a*a*a*a*a*b", &path));
        let rules = parse("**/**/**/**/**/**/x\n");
        assert!(!rules.is_excluded(&vec!["d"; 60].join("/")));
    }
}
