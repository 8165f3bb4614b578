//! The Dockerfile parser: text to [`Dockerfile`], with BuildKit's rules.
//!
//! Reading goes in three layers, as in BuildKit:
//!
//! 1. parser directives (`# escape=`, `# syntax=`) at the very top;
//! 2. logical lines: comments and blank lines dropped, lines ending with
//!    the escape character continued (comment and empty lines inside a
//!    continuation skipped), heredoc bodies of `RUN` taken as they are;
//! 3. instructions: keyword (any case), leading `--flags`, arguments.
//!
//! Words stay raw (see [`super::words`]); the parser only checks that they
//! would expand, so a stray quote is reported with its line here rather
//! than in the middle of a build.

use super::words::{self, DEFAULT_ESCAPE};
use super::{ArgDecl, Command, CopySpec, Dockerfile, Healthcheck, Instruction, Stage, Step};
use thiserror::Error;

/// Why a Dockerfile cannot be parsed, and where.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// 1-based line: where the offending instruction starts.
    pub line: usize,
    pub message: String,
}

/// Parses the text of a Dockerfile.
pub fn parse(text: &str) -> Result<Dockerfile, ParseError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let escape = directives(&lines)?;
    let mut reader = Reader { lines, next: 0, escape };
    let mut file = Assembler::default();
    while let Some(logical) = reader.instruction() {
        let line = logical.line;
        let at = |message| ParseError { line, message };
        let parsed = instruction(&logical, &mut reader).map_err(at)?;
        file.add(line, parsed).map_err(at)?;
    }
    file.finish()
}

/// The escape character of a Dockerfile (`\`, or `` ` `` after
/// `` # escape=` ``), by the same directive rules as [`parse`]: what the builder
/// passes to [`words::expand_with`]. An invalid directive (which [`parse`]
/// refuses) gives the default.
pub fn escape_char(text: &str) -> char {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    directives(&lines).unwrap_or(DEFAULT_ESCAPE)
}

// ---------------------------------------------------------------------------
// Directives

/// The escape character set by the directives at the top (`\` if none).
/// Directives are only read until the first line that is not one: a blank
/// line, a plain comment or an instruction ends them.
fn directives(lines: &[&str]) -> Result<char, ParseError> {
    let mut escape = None;
    let mut seen: Vec<String> = Vec::new();
    for (index, raw) in lines.iter().enumerate() {
        let Some((key, value)) = directive(raw) else {
            break;
        };
        let line = index + 1;
        if seen.contains(&key) {
            return Err(ParseError { line, message: format!("only one {key} parser directive can be used") });
        }
        if key == "escape" {
            escape = Some(match value {
                "\\" => '\\',
                "`" => '`',
                _ => return Err(ParseError { line, message: format!("invalid escape character {value:?}: use \\ or `") }),
            });
        }
        seen.push(key);
    }
    Ok(escape.unwrap_or(DEFAULT_ESCAPE))
}

/// `# key = value` with a directive BuildKit knows (`syntax`, `escape`,
/// `check`), key lowercased. Anything else is an ordinary comment.
fn directive(raw: &str) -> Option<(String, &str)> {
    let rest = trim_newline(raw).trim_start().strip_prefix('#')?;
    let (key, value) = rest.split_once('=')?;
    let key = key.trim();
    let mut chars = key.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_alphabetic()) && chars.all(|c| c.is_ascii_alphanumeric());
    let value = value.trim();
    let key = key.to_ascii_lowercase();
    let known = matches!(key.as_str(), "syntax" | "escape" | "check");
    (well_formed && known && !value.is_empty()).then_some((key, value))
}

// ---------------------------------------------------------------------------
// Logical lines

/// An instruction as read, continuations joined.
struct Logical {
    /// 1-based line where it starts.
    line: usize,
    /// The pieces concatenated as BuildKit does (the escape character and
    /// the blanks after it removed, nothing added): what the arguments are
    /// made of, so `"a \` + `  b"` stays inside its quotes.
    content: String,
    /// The pieces trimmed and joined with single spaces: [`Step::text`].
    text: String,
}

struct Reader<'a> {
    /// With their line endings (heredoc bodies keep them).
    lines: Vec<&'a str>,
    next: usize,
    escape: char,
}

impl<'a> Reader<'a> {
    fn raw_line(&mut self) -> Option<&'a str> {
        let line = self.lines.get(self.next)?;
        self.next += 1;
        Some(line)
    }

    /// The next instruction, skipping comments and blank lines.
    fn instruction(&mut self) -> Option<Logical> {
        loop {
            let raw = self.raw_line()?;
            let line = self.next;
            if is_comment(raw) {
                continue;
            }
            let (first, mut continued) = self.trim_continuation(trim_newline(raw).trim_start());
            if first.is_empty() && !continued {
                continue;
            }
            let mut content = first.to_string();
            let mut pieces = vec![first.trim()];
            while continued {
                let Some(raw) = self.raw_line() else {
                    break;
                };
                // BuildKit skips these without ending the continuation.
                if is_comment(raw) || trim_newline(raw).trim().is_empty() {
                    continue;
                }
                let (piece, more) = self.trim_continuation(trim_newline(raw));
                content.push_str(piece);
                pieces.push(piece.trim());
                continued = more;
            }
            if content.trim().is_empty() {
                continue;
            }
            pieces.retain(|p| !p.is_empty());
            return Some(Logical { line, content, text: pieces.join(" ") });
        }
    }

    /// The line without a final escape character (and the blanks after
    /// it), and whether there was one.
    fn trim_continuation<'s>(&self, line: &'s str) -> (&'s str, bool) {
        let trimmed = line.trim_end_matches([' ', '\t']);
        match trimmed.strip_suffix(self.escape) {
            Some(rest) => (rest, true),
            None => (line, false),
        }
    }

    /// The body of a heredoc, up to the line that is its delimiter (after
    /// leading tabs are stripped, for `<<-`); `None` if the file ends first.
    fn heredoc_body(&mut self, name: &str, chomp: bool) -> Option<String> {
        let mut body = String::new();
        loop {
            let raw = self.raw_line()?;
            let candidate = trim_newline(raw);
            let candidate = if chomp { candidate.trim_start_matches('\t') } else { candidate };
            if candidate == name {
                return Some(body);
            }
            body.push_str(raw);
        }
    }
}

fn trim_newline(line: &str) -> &str {
    line.trim_end_matches(['\r', '\n'])
}

/// `#` as the first non-blank character.
fn is_comment(raw: &str) -> bool {
    raw.trim_start().starts_with('#')
}

// ---------------------------------------------------------------------------
// Assembling stages

/// What one instruction contributes.
enum Parsed {
    From {
        base: String,
        name: Option<String>,
        platform: Option<String>,
    },
    Step {
        instruction: Instruction,
        text: String,
    },
    /// `MAINTAINER`: valid, deprecated, without effect.
    Dropped {
        keyword: String,
    },
}

#[derive(Default)]
struct Assembler {
    global_args: Vec<ArgDecl>,
    stages: Vec<Stage>,
}

impl Assembler {
    fn add(&mut self, line: usize, parsed: Parsed) -> Result<(), String> {
        match parsed {
            Parsed::From { base, name, platform } => {
                if let Some(name) = &name {
                    if let Some(earlier) = self.stages.iter().find(|s| s.name.as_ref() == Some(name)) {
                        return Err(format!("duplicate stage name {name:?} (first used on line {})", earlier.line));
                    }
                }
                let index = self.stages.len();
                self.stages.push(Stage { index, base, name, platform, line, steps: Vec::new() });
                Ok(())
            }
            Parsed::Step { instruction, text } => match self.stages.last_mut() {
                Some(stage) => {
                    stage.steps.push(Step { line, text, instruction });
                    Ok(())
                }
                None => match instruction {
                    Instruction::Arg(args) => {
                        self.global_args.extend(args);
                        Ok(())
                    }
                    _ => Err(before_from(&text)),
                },
            },
            Parsed::Dropped { keyword } => match self.stages.is_empty() {
                true => Err(before_from(&keyword)),
                false => Ok(()),
            },
        }
    }

    fn finish(self) -> Result<Dockerfile, ParseError> {
        if self.stages.is_empty() {
            return Err(ParseError { line: 1, message: "no FROM instruction: a Dockerfile needs at least one stage".to_string() });
        }
        Ok(Dockerfile { global_args: self.global_args, stages: self.stages })
    }
}

fn before_from(text: &str) -> String {
    let keyword = text.split_whitespace().next().unwrap_or_default().to_ascii_uppercase();
    format!("{keyword} before the first FROM (only ARG may come before FROM)")
}

// ---------------------------------------------------------------------------
// Instructions

/// Parses one logical line (and the heredoc body after it, for `RUN`).
fn instruction(logical: &Logical, reader: &mut Reader) -> Result<Parsed, String> {
    let escape = reader.escape;
    let (keyword, rest) = split_keyword(&logical.content);
    let name = keyword.to_ascii_uppercase();
    let (raw_flags, args) = words::split_flags(rest, escape);
    let flags = Flags::parse(&name, raw_flags)?;
    let step = |instruction| Ok(Parsed::Step { instruction, text: logical.text.clone() });
    match name.as_str() {
        "FROM" => from(args, &flags, escape),
        "RUN" => run(args, &flags, logical, reader),
        "COPY" => step(Instruction::Copy(copy(false, args, &flags, escape)?)),
        "ADD" => step(Instruction::Copy(copy(true, args, &flags, escape)?)),
        "ENV" => {
            flags.check(&[], &[])?;
            step(Instruction::Env(key_values("ENV", args, escape)?))
        }
        "ARG" => {
            flags.check(&[], &[])?;
            step(Instruction::Arg(arg_decls(args, escape)?))
        }
        "WORKDIR" => step(Instruction::Workdir(single_word("WORKDIR", args, &flags, escape)?)),
        "USER" => step(Instruction::User(single_word("USER", args, &flags, escape)?)),
        "STOPSIGNAL" => step(Instruction::StopSignal(single_word("STOPSIGNAL", args, &flags, escape)?)),
        "LABEL" => {
            flags.check(&[], &[])?;
            step(Instruction::Label(key_values("LABEL", args, escape)?))
        }
        "EXPOSE" => step(Instruction::Expose(expose(args, &flags, escape)?)),
        "VOLUME" => step(Instruction::Volume(volume(args, &flags, escape)?)),
        "ENTRYPOINT" | "CMD" => {
            flags.check(&[], &[])?;
            let command = command(&name, args)?;
            step(if name == "CMD" { Instruction::Cmd(command) } else { Instruction::Entrypoint(command) })
        }
        "HEALTHCHECK" => step(Instruction::Healthcheck(healthcheck(args, &flags)?)),
        "SHELL" => step(Instruction::Shell(shell(args, &flags)?)),
        "MAINTAINER" => {
            flags.check(&[], &[])?;
            Ok(Parsed::Dropped { keyword: name })
        }
        "ONBUILD" => Err("ONBUILD is not supported".to_string()),
        _ => Err(format!("unknown instruction: {keyword}")),
    }
}

/// The keyword and the rest, trimmed.
fn split_keyword(content: &str) -> (&str, &str) {
    let content = content.trim();
    match content.find(char::is_whitespace) {
        Some(i) => (&content[..i], content[i..].trim_start()),
        None => (content, ""),
    }
}

/// `FROM [--platform=..] image [AS name]`.
fn from(args: &str, flags: &Flags, escape: char) -> Result<Parsed, String> {
    flags.check(&["platform"], &[])?;
    let platform = flags.raw_value("platform")?;
    if let Some(platform) = &platform {
        check_word("FROM --platform", platform, escape)?;
    }
    let words = words::split_words_with(args, escape);
    let (base, name) = match words.as_slice() {
        [] => return Err("FROM needs an image (FROM image [AS name])".to_string()),
        [base] => (base.clone(), None),
        [base, as_keyword, name] if as_keyword.eq_ignore_ascii_case("as") => (base.clone(), Some(stage_name(name)?)),
        _ => return Err(format!("FROM takes an image and an optional AS name (FROM image [AS name]), not {args:?}")),
    };
    check_word("FROM image", &base, escape)?;
    Ok(Parsed::From { base, name, platform })
}

/// A stage name, lowercased; as BuildKit, a letter then letters, digits,
/// `-`, `_` or `.`.
fn stage_name(raw: &str) -> Result<String, String> {
    let name = raw.to_ascii_lowercase();
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    match valid {
        true => Ok(name),
        false => Err(format!("invalid stage name {raw:?}: it must start with a letter and hold only letters, digits, '-', '_' and '.'")),
    }
}

/// `RUN [--network=..] command`, in shell form, exec form or with a heredoc.
fn run(args: &str, flags: &Flags, logical: &Logical, reader: &mut Reader) -> Result<Parsed, String> {
    flags.check(&["network"], &["mount", "security", "device"])?;
    let network = flags.unquoted_value("network", reader.escape)?;
    if let Some(network) = &network {
        if !matches!(network.as_str(), "none" | "default" | "host") {
            return Err(format!("RUN --network={network} is not supported (use none, default or host)"));
        }
    }
    let text = logical.text.clone();
    if let Some(exec) = json_array(args) {
        if exec.is_empty() {
            return Err("RUN needs a command".to_string());
        }
        return Ok(Parsed::Step { instruction: Instruction::Run { command: Command::Exec(exec), network }, text });
    }
    if args.is_empty() {
        return Err("RUN needs a command".to_string());
    }
    let line_words = words::split_words_with(args, reader.escape);
    let mut heredocs = Vec::new();
    for word in &line_words {
        heredocs.extend(heredoc_word(word)?);
    }
    let (command, text) = match heredocs.as_slice() {
        [] => (Command::Shell(args.to_string()), text),
        [heredoc] => {
            let body = reader
                .heredoc_body(&heredoc.name, heredoc.chomp)
                .ok_or_else(|| format!("unterminated heredoc: no line {:?} ends the one opened here", heredoc.name))?;
            let whole = line_words.len() == 1;
            let command = heredoc_command(args, heredoc, &body, whole);
            (command, format!("{text}\n{body}{}", heredoc.name))
        }
        _ => return Err(format!("only one heredoc per RUN is supported, found {}", heredocs.len())),
    };
    Ok(Parsed::Step { instruction: Instruction::Run { command, network }, text })
}

/// A heredoc opened on an instruction line: `<<EOF`, `<<-EOF`, `<<"EOF"`,
/// `<<'EOF'`, maybe after a file descriptor (`3<<EOF`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Heredoc {
    /// The delimiter, unquoted.
    name: String,
    /// `<<-`: leading tabs stripped from the body and the delimiter line.
    chomp: bool,
}

/// The heredoc a raw word opens, if any. As BuildKit, only a whole word
/// counts (`cat<<EOF` does not), and `<<<` is not one.
fn heredoc_word(word: &str) -> Result<Option<Heredoc>, String> {
    let rest = word.trim_start_matches(|c: char| c.is_ascii_digit());
    let Some(rest) = rest.strip_prefix("<<") else {
        return Ok(None);
    };
    let (chomp, rest) = match rest.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    if rest.is_empty() || rest.contains('<') {
        return Ok(None);
    }
    // BuildKit reads the delimiter with `\` as escape whatever the directive.
    let name = words::unquote_with(rest, DEFAULT_ESCAPE).map_err(|e| format!("heredoc delimiter {rest:?}: {e}"))?;
    if name.is_empty() {
        return Err(format!("empty heredoc delimiter in {word:?}"));
    }
    Ok(Some(Heredoc { name, chomp }))
}

/// The command of a `RUN` with a heredoc (see [`Command::Shell`]).
///
/// - the heredoc is the whole command (`RUN <<EOF`): its body is the
///   script (tabs stripped for `<<-`). A body starting with `#!` is, in
///   BuildKit, a file run by its interpreter; here the interpreter gets the
///   body on its stdin, which the shell can express with the same types;
/// - the heredoc feeds a command (`RUN python3 <<EOF`): the command line,
///   the body and the delimiter, for the shell to read itself.
fn heredoc_command(args: &str, heredoc: &Heredoc, body: &str, whole: bool) -> Command {
    if !whole {
        return Command::Shell(format!("{args}\n{body}{}", heredoc.name));
    }
    let script = if heredoc.chomp { strip_leading_tabs(body) } else { body.to_string() };
    match shebang_command(&script, &heredoc.name) {
        Some(command) => Command::Shell(command),
        None => Command::Shell(script),
    }
}

fn strip_leading_tabs(body: &str) -> String {
    body.split_inclusive('\n').map(|line| line.trim_start_matches('\t')).collect()
}

/// For a script starting with `#!interpreter [arg]`: the interpreter (and
/// its one argument, as the kernel splits a `#!` line) fed the script on
/// its stdin by a quoted heredoc. The script holds no line equal to the
/// delimiter, else the heredoc would have ended there.
fn shebang_command(script: &str, delimiter: &str) -> Option<String> {
    let first = trim_newline(script.lines().next()?);
    let spec = first.strip_prefix("#!")?.trim_matches([' ', '\t']);
    let (interpreter, arg) = match spec.find([' ', '\t']) {
        Some(i) => (&spec[..i], spec[i..].trim_matches([' ', '\t'])),
        None => (spec, ""),
    };
    if interpreter.is_empty() {
        return None;
    }
    let mut command = shell_quote(interpreter);
    if !arg.is_empty() {
        command.push(' ');
        command.push_str(&shell_quote(arg));
    }
    let mut script = script.to_string();
    if !script.ends_with('\n') {
        script.push('\n');
    }
    Some(format!("{command} <<{}\n{script}{delimiter}", shell_quote(delimiter)))
}

/// `s` in single quotes for sh (`'` written `'\''`).
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `COPY`/`ADD [--from=..] [--chown=..] [--chmod=..] src... dest`.
fn copy(add: bool, args: &str, flags: &Flags, escape: char) -> Result<CopySpec, String> {
    let name = if add { "ADD" } else { "COPY" };
    if add {
        flags.check(&["chown", "chmod", "link"], &["checksum", "keep-git-dir", "exclude", "unpack", "parents"])?;
    } else {
        flags.check(&["from", "chown", "chmod", "link"], &["parents", "exclude"])?;
    }
    // `--link` only changes how BuildKit caches the layer: the files are the same.
    flags.boolean("link", escape)?;
    let from = flags.raw_value("from")?;
    let chown = flags.raw_value("chown")?;
    let chmod = flags.raw_value("chmod")?;
    for (flag, value) in [("--from", &from), ("--chown", &chown), ("--chmod", &chmod)] {
        if let Some(value) = value {
            check_word(&format!("{name} {flag}"), value, escape)?;
        }
    }
    let mut words = match json_array(args) {
        Some(words) => words,
        None => {
            // Refused rather than misread: the body lines would be taken
            // for instructions.
            let words = words::split_words_with(args, escape);
            if words.iter().any(|w| heredoc_word(w).ok().flatten().is_some()) {
                return Err(format!("{name} with a heredoc (<<EOF) is not supported"));
            }
            words
        }
    };
    // Before counting: an unclosed quote swallows the rest of the line.
    for word in &words {
        check_word(name, word, escape)?;
    }
    if words.len() < 2 {
        return Err(format!("{name} needs at least a source and a destination"));
    }
    let dest = words.pop().unwrap_or_default();
    Ok(CopySpec { add, sources: words, dest, from, chown, chmod })
}

/// `ENV`/`LABEL`: `k=v k2="a b" ...`, or the legacy `k value words`, where
/// the value is the rest of the line.
fn key_values(name: &str, args: &str, escape: char) -> Result<Vec<(String, String)>, String> {
    let words = words::split_words_with(args, escape);
    let Some(first) = words.first() else {
        return Err(format!("{name} needs a name and a value ({name} name=value ...)"));
    };
    let pairs = if words::split_key_value(first, escape).is_none() {
        let Some((key, value)) = args.split_once(char::is_whitespace) else {
            return Err(format!("{name} {first} needs a value ({name} name=value ...)"));
        };
        vec![(key.to_string(), value.trim_start().to_string())]
    } else {
        let mut pairs = Vec::new();
        for word in &words {
            let (key, value) = words::split_key_value(word, escape)
                .ok_or_else(|| format!("{name}: {word:?} is not name=value (the legacy \"{name} name value\" form takes one pair only)"))?;
            pairs.push((key.to_string(), value.to_string()));
        }
        pairs
    };
    for (key, value) in &pairs {
        if key.is_empty() {
            return Err(format!("{name} names cannot be blank"));
        }
        check_word(&format!("{name} name"), key, escape)?;
        check_word(&format!("{name} {key}"), value, escape)?;
    }
    Ok(pairs)
}

/// `ARG name[=default] ...`.
fn arg_decls(args: &str, escape: char) -> Result<Vec<ArgDecl>, String> {
    let words = words::split_words_with(args, escape);
    if words.is_empty() {
        return Err("ARG needs a name (ARG name[=default] ...)".to_string());
    }
    let mut decls = Vec::new();
    for word in words {
        let (name, default) = match words::split_key_value(&word, escape) {
            Some((name, default)) => (name.to_string(), Some(default.to_string())),
            None => (word.clone(), None),
        };
        if name.is_empty() {
            return Err("ARG names cannot be blank".to_string());
        }
        if name.contains(['\'', '"', '$', escape]) {
            return Err(format!("ARG name {name:?} must be a plain name, without quotes or $"));
        }
        if let Some(default) = &default {
            check_word(&format!("ARG {name}"), default, escape)?;
        }
        decls.push(ArgDecl { name, default });
    }
    Ok(decls)
}

/// `WORKDIR`, `USER`, `STOPSIGNAL`: the rest of the line, as one word.
fn single_word(name: &str, args: &str, flags: &Flags, escape: char) -> Result<String, String> {
    flags.check(&[], &[])?;
    if args.is_empty() {
        return Err(format!("{name} needs a value"));
    }
    check_word(name, args, escape)?;
    Ok(args.to_string())
}

/// `EXPOSE port[/proto] ...`.
fn expose(args: &str, flags: &Flags, escape: char) -> Result<Vec<String>, String> {
    flags.check(&[], &[])?;
    let ports = words::split_words_with(args, escape);
    if ports.is_empty() {
        return Err("EXPOSE needs at least one port".to_string());
    }
    for port in &ports {
        check_word("EXPOSE", port, escape)?;
    }
    Ok(ports)
}

/// `VOLUME ["/a", "/b"]` or `VOLUME /a /b`.
fn volume(args: &str, flags: &Flags, escape: char) -> Result<Vec<String>, String> {
    flags.check(&[], &[])?;
    let paths = json_array(args).unwrap_or_else(|| words::split_words_with(args, escape));
    if paths.is_empty() {
        return Err("VOLUME needs at least one path".to_string());
    }
    for path in &paths {
        if path.trim().is_empty() {
            return Err("VOLUME paths cannot be empty".to_string());
        }
        check_word("VOLUME", path, escape)?;
    }
    Ok(paths)
}

/// `CMD`/`ENTRYPOINT`: exec form (`[]` allowed: it clears) or shell form.
fn command(name: &str, args: &str) -> Result<Command, String> {
    if let Some(exec) = json_array(args) {
        return Ok(Command::Exec(exec));
    }
    if args.is_empty() {
        return Err(format!("{name} needs a command"));
    }
    Ok(Command::Shell(args.to_string()))
}

/// `HEALTHCHECK NONE` or `HEALTHCHECK [--options] CMD command`.
fn healthcheck(args: &str, flags: &Flags) -> Result<Healthcheck, String> {
    let (kind, rest) = split_keyword(args);
    match kind.to_ascii_uppercase().as_str() {
        "" => Err("HEALTHCHECK needs NONE or CMD command".to_string()),
        "NONE" => {
            if !rest.is_empty() {
                return Err("HEALTHCHECK NONE takes no arguments".to_string());
            }
            flags.check(&[], &[]).map_err(|_| "HEALTHCHECK NONE takes no options".to_string())?;
            Ok(Healthcheck::None)
        }
        "CMD" => {
            flags.check(&["interval", "timeout", "start-period", "start-interval", "retries"], &[])?;
            let test = match json_array(rest) {
                Some(exec) if exec.is_empty() => return Err("HEALTHCHECK CMD needs a command".to_string()),
                Some(exec) => Command::Exec(exec),
                None if rest.is_empty() => return Err("HEALTHCHECK CMD needs a command".to_string()),
                None => Command::Shell(rest.to_string()),
            };
            Ok(Healthcheck::Check {
                test,
                interval: flags.duration("interval")?,
                timeout: flags.duration("timeout")?,
                start_period: flags.duration("start-period")?,
                start_interval: flags.duration("start-interval")?,
                retries: flags.retries()?,
            })
        }
        _ => Err(format!("HEALTHCHECK: unknown type {kind:?} (use CMD or NONE)")),
    }
}

/// `SHELL ["executable", "parameters"...]`.
fn shell(args: &str, flags: &Flags) -> Result<Vec<String>, String> {
    flags.check(&[], &[])?;
    match json_array(args) {
        None => Err("SHELL needs the JSON form, as in SHELL [\"/bin/bash\", \"-c\"]".to_string()),
        Some(words) if words.is_empty() => Err("SHELL needs at least the executable".to_string()),
        Some(words) => Ok(words),
    }
}

/// The exec form: arguments that parse as a JSON array of strings (as
/// Docker decides; anything else is the shell form).
fn json_array(args: &str) -> Option<Vec<String>> {
    if !args.starts_with('[') {
        return None;
    }
    serde_json::from_str(args).ok()
}

/// Checks that a raw word would expand (closed quotes and braces, known
/// modifiers), so the error comes with its line.
fn check_word(what: &str, raw: &str, escape: char) -> Result<(), String> {
    // Every variable set: `${X:?}` is a build-time matter, not a syntax one.
    let any = |_: &str| Some("x".to_string());
    words::expand_with(raw, &any, escape).map(|_| ()).map_err(|e| format!("{what}: {e}"))
}

// ---------------------------------------------------------------------------
// Flags

/// The `--name[=value]` flags of an instruction, values raw.
struct Flags {
    instruction: String,
    items: Vec<(String, Option<String>)>,
}

impl Flags {
    fn parse(instruction: &str, raw: Vec<String>) -> Result<Self, String> {
        let mut items: Vec<(String, Option<String>)> = Vec::new();
        for flag in raw {
            let body = flag.strip_prefix("--").unwrap_or(&flag);
            let (name, value) = match body.split_once('=') {
                Some((name, value)) => (name.to_string(), Some(value.to_string())),
                None => (body.to_string(), None),
            };
            if items.iter().any(|(seen, _)| *seen == name) {
                return Err(format!("{instruction}: --{name} given more than once"));
            }
            items.push((name, value));
        }
        Ok(Flags { instruction: instruction.to_string(), items })
    }

    /// Refuses the flags not in `allowed`: those of `unsupported` (valid in
    /// BuildKit) as not supported, the others as unknown.
    fn check(&self, allowed: &[&str], unsupported: &[&str]) -> Result<(), String> {
        for (name, _) in &self.items {
            if unsupported.contains(&name.as_str()) {
                return Err(format!("{} --{name} is not supported", self.instruction));
            }
            if !allowed.contains(&name.as_str()) {
                return Err(format!("unknown flag --{name} for {}", self.instruction));
            }
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Option<&Option<String>> {
        self.items.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// A string flag's value as written; an empty one counts as absent, as
    /// in BuildKit.
    fn raw_value(&self, name: &str) -> Result<Option<String>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(None) => Err(format!("{} --{name} needs a value (--{name}=...)", self.instruction)),
            Some(Some(value)) if value.is_empty() => Ok(None),
            Some(Some(value)) => Ok(Some(value.clone())),
        }
    }

    /// A string flag's value with its quotes removed: for the flags BuildKit
    /// does not expand.
    fn unquoted_value(&self, name: &str, escape: char) -> Result<Option<String>, String> {
        let Some(raw) = self.raw_value(name)? else {
            return Ok(None);
        };
        let value = words::unquote_with(&raw, escape).map_err(|e| format!("{} --{name}: {e}", self.instruction))?;
        Ok((!value.is_empty()).then_some(value))
    }

    /// A boolean flag: `--name`, `--name=true` or `--name=false`.
    fn boolean(&self, name: &str, escape: char) -> Result<bool, String> {
        match self.get(name) {
            None => Ok(false),
            Some(None) => Ok(true),
            Some(Some(raw)) => match words::unquote_with(raw, escape).unwrap_or_default().to_ascii_lowercase().as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(format!("{} --{name} takes true or false, not {raw:?}", self.instruction)),
            },
        }
    }

    /// A `HEALTHCHECK` duration (Go syntax: `30s`, `1m30s`, `500ms`): 0,
    /// or at least 1ms.
    fn duration(&self, name: &str) -> Result<Option<String>, String> {
        let Some(value) = self.unquoted_value(name, DEFAULT_ESCAPE)? else {
            return Ok(None);
        };
        match go_duration_nanos(&value) {
            None => Err(format!("HEALTHCHECK --{name}={value} is not a duration (like 30s, 1m30s or 500ms)")),
            Some(nanos) if nanos != 0.0 && nanos < 1e6 => Err(format!("HEALTHCHECK --{name} cannot be less than 1ms")),
            Some(_) => Ok(Some(value)),
        }
    }

    /// `HEALTHCHECK --retries`: a non-negative number.
    fn retries(&self) -> Result<Option<String>, String> {
        let Some(value) = self.unquoted_value("retries", DEFAULT_ESCAPE)? else {
            return Ok(None);
        };
        match value.parse::<i32>() {
            Ok(n) if n < 0 => Err(format!("HEALTHCHECK --retries cannot be negative ({n})")),
            Ok(_) => Ok(Some(value)),
            Err(_) => Err(format!("HEALTHCHECK --retries={value} is not a number")),
        }
    }
}

/// A Go `time.ParseDuration` string in nanoseconds: an optional sign, then
/// numbers (decimals allowed) each with a unit (`ns`, `us`, `µs`, `ms`,
/// `s`, `m`, `h`); `0` alone needs no unit.
fn go_duration_nanos(text: &str) -> Option<f64> {
    let (negative, mut rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if rest == "0" {
        return Some(0.0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_len..];
    }
    Some(if negative { -total } else { total })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Dockerfile {
        match parse(text) {
            Ok(file) => file,
            Err(e) => panic!("parse failed: {e}\n{text}"),
        }
    }

    fn error(text: &str) -> ParseError {
        match parse(text) {
            Ok(file) => panic!("parse should fail: {file:?}"),
            Err(e) => e,
        }
    }

    /// The instructions of the only (or last) stage.
    fn steps(text: &str) -> Vec<Instruction> {
        let file = parsed(text);
        file.stages.last().map(|s| s.steps.iter().map(|s| s.instruction.clone()).collect()).unwrap_or_default()
    }

    /// The one instruction after `FROM scratch`.
    fn one(instruction: &str) -> Instruction {
        let mut all = steps(&format!("FROM scratch\n{instruction}\n"));
        assert_eq!(all.len(), 1, "{all:?}");
        all.remove(0)
    }

    fn one_error(instruction: &str) -> String {
        let e = error(&format!("FROM scratch\n{instruction}\n"));
        assert_eq!(e.line, 2, "{e}");
        e.message
    }

    fn shell(text: &str) -> Command {
        Command::Shell(text.to_string())
    }

    fn exec(words: &[&str]) -> Command {
        Command::Exec(words.iter().map(|w| w.to_string()).collect())
    }

    fn run_shell(text: &str) -> Instruction {
        Instruction::Run { command: shell(text), network: None }
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    const TASK_IMAGE: &str = r#"# Terminal-Bench style task image
FROM python:3.12-slim

# Install the tools the task needs
RUN apt-get update && apt-get install -y \
    # build tools
    build-essential \
    curl \

    git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

COPY requirements.txt /app/
RUN pip install --no-cache-dir -r requirements.txt
COPY tests/ /tests/
COPY --chown=agent:agent src/ /app/src/

RUN useradd -m agent
ENV PYTHONUNBUFFERED=1 PATH="/home/agent/.local/bin:$PATH"
USER agent
CMD ["bash"]
"#;

    #[test]
    fn task_image() {
        let file = parsed(TASK_IMAGE);
        assert!(file.global_args.is_empty());
        assert_eq!(file.stages.len(), 1);
        let stage = &file.stages[0];
        assert_eq!(stage.index, 0);
        assert_eq!(stage.base, "python:3.12-slim");
        assert_eq!(stage.name, None);
        assert_eq!(stage.platform, None);
        assert_eq!(stage.line, 2);
        let lines: Vec<usize> = stage.steps.iter().map(|s| s.line).collect();
        assert_eq!(lines, [5, 13, 15, 16, 17, 18, 20, 21, 22, 23]);
        assert_eq!(
            stage.steps[0].instruction,
            run_shell("apt-get update && apt-get install -y     build-essential     curl     git     && rm -rf /var/lib/apt/lists/*")
        );
        assert_eq!(stage.steps[0].text, "RUN apt-get update && apt-get install -y build-essential curl git && rm -rf /var/lib/apt/lists/*");
        assert_eq!(stage.steps[1].instruction, Instruction::Workdir("/app".into()));
        assert_eq!(
            stage.steps[4].instruction,
            Instruction::Copy(CopySpec {
                add: false,
                sources: strings(&["tests/"]),
                dest: "/tests/".into(),
                from: None,
                chown: None,
                chmod: None
            })
        );
        match &stage.steps[5].instruction {
            Instruction::Copy(spec) => assert_eq!(spec.chown.as_deref(), Some("agent:agent")),
            other => panic!("{other:?}"),
        }
        assert_eq!(stage.steps[6].instruction, run_shell("useradd -m agent"));
        assert_eq!(
            stage.steps[7].instruction,
            Instruction::Env(pairs(&[("PYTHONUNBUFFERED", "1"), ("PATH", "\"/home/agent/.local/bin:$PATH\"")]))
        );
        assert_eq!(stage.steps[8].instruction, Instruction::User("agent".into()));
        assert_eq!(stage.steps[9].instruction, Instruction::Cmd(exec(&["bash"])));
        assert_eq!(stage.steps[9].text, "CMD [\"bash\"]");
    }

    const MULTI_STAGE: &str = r#"ARG GO_VERSION=1.22
ARG BASE
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS Build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -o /out/app ./cmd/app

FROM ${BASE:-debian:bookworm-slim}
ARG BASE
COPY --from=build /out/app /usr/local/bin/
COPY --from=0 /src/LICENSE /usr/share/doc/app/
ENTRYPOINT ["/usr/local/bin/app"]
"#;

    #[test]
    fn multi_stage_build() {
        let file = parsed(MULTI_STAGE);
        assert_eq!(
            file.global_args,
            [ArgDecl { name: "GO_VERSION".into(), default: Some("1.22".into()) }, ArgDecl { name: "BASE".into(), default: None }]
        );
        assert_eq!(file.stages.len(), 2);
        let build = &file.stages[0];
        assert_eq!(build.base, "golang:${GO_VERSION}");
        assert_eq!(build.name.as_deref(), Some("build"));
        assert_eq!(build.platform.as_deref(), Some("$BUILDPLATFORM"));
        assert_eq!(build.line, 3);
        assert_eq!(build.steps.len(), 5);
        match &build.steps[1].instruction {
            Instruction::Copy(spec) => {
                assert_eq!(spec.sources, ["go.mod", "go.sum"]);
                assert_eq!(spec.dest, "./");
            }
            other => panic!("{other:?}"),
        }
        let run = &file.stages[1];
        assert_eq!(run.index, 1);
        assert_eq!(run.base, "${BASE:-debian:bookworm-slim}");
        assert_eq!(run.name, None);
        assert_eq!(run.line, 10);
        assert_eq!(run.steps[0].instruction, Instruction::Arg(vec![ArgDecl { name: "BASE".into(), default: None }]));
        match &run.steps[1].instruction {
            Instruction::Copy(spec) => {
                assert_eq!(spec.from.as_deref(), Some("build"));
                assert_eq!(spec.sources, ["/out/app"]);
                assert_eq!(spec.dest, "/usr/local/bin/");
            }
            other => panic!("{other:?}"),
        }
        match &run.steps[2].instruction {
            Instruction::Copy(spec) => assert_eq!(spec.from.as_deref(), Some("0")),
            other => panic!("{other:?}"),
        }
        assert_eq!(run.steps[3].instruction, Instruction::Entrypoint(exec(&["/usr/local/bin/app"])));
    }

    #[test]
    fn keywords_are_case_insensitive() {
        let file = parsed("from alpine as Base\nrun echo hi\nWorkDir /x\ncopy a b\n");
        assert_eq!(file.stages[0].name.as_deref(), Some("base"));
        assert_eq!(file.stages[0].steps[0].instruction, run_shell("echo hi"));
        assert_eq!(file.stages[0].steps[1].instruction, Instruction::Workdir("/x".into()));
        assert_eq!(file.stages[0].steps[0].text, "run echo hi");
    }

    #[test]
    fn comments_blank_lines_and_indentation() {
        let file = parsed("\n# comment\n   # indented comment\n\n  FROM alpine\n\t RUN echo # not a comment\n\n");
        assert_eq!(file.stages[0].line, 5);
        assert_eq!(file.stages[0].steps[0].instruction, run_shell("echo # not a comment"));
        assert_eq!(file.stages[0].steps[0].line, 6);
    }

    #[test]
    fn crlf_and_bom() {
        let file = parsed("\u{feff}FROM alpine\r\nRUN echo a \\\r\n  b\r\nENV A=1\r\n");
        assert_eq!(file.stages[0].steps[0].instruction, run_shell("echo a   b"));
        assert_eq!(file.stages[0].steps[1].instruction, Instruction::Env(pairs(&[("A", "1")])));
    }

    #[test]
    fn continuation_lines() {
        let file = parsed("FROM alpine\nRUN echo a \\\n  b \\  \n  c\nRUN echo done\n");
        let stage = &file.stages[0];
        assert_eq!(stage.steps[0].instruction, run_shell("echo a   b   c"));
        assert_eq!(stage.steps[0].text, "RUN echo a b c");
        assert_eq!(stage.steps[1].line, 5);
    }

    #[test]
    fn continuation_keeps_quoted_text_together() {
        let file = parsed("FROM alpine\nENV MSG=\"hello \\\n world\"\n");
        assert_eq!(file.stages[0].steps[0].instruction, Instruction::Env(pairs(&[("MSG", "\"hello  world\"")])));
    }

    #[test]
    fn comments_and_empty_lines_inside_continuations() {
        let file = parsed("FROM alpine\nRUN a \\\n# one\n    # two\n\n   \n  b\nUSER x\n");
        let stage = &file.stages[0];
        assert_eq!(stage.steps[0].instruction, run_shell("a   b"));
        assert_eq!(stage.steps[0].text, "RUN a b");
        assert_eq!(stage.steps[1].line, 8);
    }

    #[test]
    fn continuation_at_end_of_file() {
        let file = parsed("FROM alpine\nRUN echo a \\\n");
        assert_eq!(file.stages[0].steps[0].instruction, run_shell("echo a"));
    }

    #[test]
    fn continuation_starting_the_keyword_line() {
        let file = parsed("FROM alpine\nRUN \\\n  echo hi\n");
        assert_eq!(file.stages[0].steps[0].instruction, run_shell("echo hi"));
        assert_eq!(file.stages[0].steps[0].text, "RUN echo hi");
    }

    #[test]
    fn escape_directive() {
        let file = parsed("# escape=`\nFROM mcr.microsoft.com/windows\nRUN dir C:\\ `\n  /s\nCOPY a\\b `\n  c:\\dest\\\n");
        let stage = &file.stages[0];
        assert_eq!(stage.steps[0].instruction, run_shell("dir C:\\   /s"));
        match &stage.steps[1].instruction {
            Instruction::Copy(spec) => {
                assert_eq!(spec.sources, ["a\\b"]);
                assert_eq!(spec.dest, "c:\\dest\\");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn directive_forms() {
        for top in ["#escape=`", "# escape = `", "  #  ESCAPE=`  ", "# syntax=docker/dockerfile:1\n# escape=`"] {
            let file = parsed(&format!("{top}\nFROM x\nRUN a `\n b\n"));
            assert_eq!(file.stages[0].steps[0].instruction, run_shell("a  b"), "{top}");
        }
    }

    #[test]
    fn directives_only_at_the_very_top() {
        // After a blank line, a comment or an unknown directive, `# escape=`
        // is just a comment, and `\` stays the escape character.
        for top in ["\n# escape=`", "# hello\n# escape=`", "# foo=bar\n# escape=`", "FROM y\n# escape=`"] {
            let file = parsed(&format!("{top}\nFROM x\nRUN a \\\n b\n"));
            assert_eq!(file.stages.last().map(|s| s.steps[0].instruction.clone()), Some(run_shell("a  b")), "{top}");
        }
    }

    #[test]
    fn directive_errors() {
        let e = error("# escape=x\nFROM a\n");
        assert_eq!(e.line, 1);
        assert!(e.message.contains("invalid escape character"), "{e}");
        let e = error("# escape=`\n# escape=\\\nFROM a\n");
        assert_eq!(e.line, 2);
        assert!(e.message.contains("only one escape"), "{e}");
    }

    #[test]
    fn escape_char_of_a_dockerfile() {
        assert_eq!(escape_char("FROM a\n"), '\\');
        assert_eq!(escape_char("# escape=`\nFROM a\n"), '`');
        assert_eq!(escape_char("\u{feff}# syntax=x\n#escape = `\nFROM a\n"), '`');
        assert_eq!(escape_char("# foo=bar\n# escape=`\nFROM a\n"), '\\');
        assert_eq!(escape_char("\n# escape=`\nFROM a\n"), '\\');
        assert_eq!(escape_char("# escape=x\nFROM a\n"), '\\');
    }

    #[test]
    fn syntax_directive_is_ignored() {
        let file = parsed("# syntax=docker/dockerfile:1.7\nFROM alpine\n");
        assert_eq!(file.stages[0].line, 2);
    }

    #[test]
    fn from_forms() {
        let file = parsed("FROM scratch\nFROM --platform=linux/amd64 ubuntu:24.04 as my-stage.2_x\nFROM my-stage.2_x\n");
        assert_eq!(file.stages[0].base, "scratch");
        assert_eq!(file.stages[1].platform.as_deref(), Some("linux/amd64"));
        assert_eq!(file.stages[1].name.as_deref(), Some("my-stage.2_x"));
        assert_eq!(file.stages[2].base, "my-stage.2_x");
        assert_eq!(file.stages.iter().map(|s| s.index).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn from_errors() {
        assert!(error("FROM\n").message.contains("FROM needs an image"));
        assert!(error("FROM a b\n").message.contains("FROM takes an image"));
        assert!(error("FROM a AT b\n").message.contains("FROM takes an image"));
        assert!(error("FROM a AS 1st\n").message.contains("invalid stage name"));
        assert!(error("FROM a AS b/c\n").message.contains("invalid stage name"));
        assert!(error("FROM --platform linux a\n").message.contains("--platform needs a value"));
        assert!(error("FROM --foo=bar a\n").message.contains("unknown flag --foo for FROM"));
        assert!(error("FROM \"a\n").message.contains("unterminated double quote"));
    }

    #[test]
    fn duplicate_stage_names() {
        let e = error("FROM a AS build\nRUN x\nFROM b AS BUILD\n");
        assert_eq!(e.line, 3);
        assert!(e.message.contains("duplicate stage name \"build\""), "{e}");
        assert!(e.message.contains("line 1"), "{e}");
    }

    #[test]
    fn instructions_before_from() {
        let e = error("# header\nARG X=1\nRUN echo\nFROM a\n");
        assert_eq!(e.line, 3);
        assert_eq!(e.message, "RUN before the first FROM (only ARG may come before FROM)");
        let e = error("MAINTAINER me\nFROM a\n");
        assert_eq!(e.line, 1);
        assert!(e.message.starts_with("MAINTAINER before the first FROM"), "{e}");
    }

    #[test]
    fn no_from() {
        let e = error("ARG A\n# only args\n");
        assert_eq!(e.line, 1);
        assert!(e.message.contains("no FROM"), "{e}");
        assert!(error("").message.contains("no FROM"));
        assert!(error("# nothing\n\n").message.contains("no FROM"));
    }

    #[test]
    fn global_args_and_stage_args() {
        let file = parsed("ARG A B=2 C=\"x y\"\nFROM img:$B\nARG A D=${B}\n");
        assert_eq!(
            file.global_args,
            [
                ArgDecl { name: "A".into(), default: None },
                ArgDecl { name: "B".into(), default: Some("2".into()) },
                ArgDecl { name: "C".into(), default: Some("\"x y\"".into()) },
            ]
        );
        assert_eq!(
            file.stages[0].steps[0].instruction,
            Instruction::Arg(vec![ArgDecl { name: "A".into(), default: None }, ArgDecl { name: "D".into(), default: Some("${B}".into()) }])
        );
        assert_eq!(one("ARG E="), Instruction::Arg(vec![ArgDecl { name: "E".into(), default: Some(String::new()) }]));
    }

    #[test]
    fn arg_errors() {
        assert!(one_error("ARG").contains("ARG needs a name"));
        assert!(one_error("ARG =x").contains("cannot be blank"));
        assert!(one_error("ARG \"A\"=x").contains("plain name"));
        assert!(one_error("ARG A=\"x").contains("ARG A: unterminated double quote"));
    }

    #[test]
    fn run_shell_form() {
        assert_eq!(one("RUN echo \"hello world\" > /tmp/x && cat /tmp/x"), run_shell("echo \"hello world\" > /tmp/x && cat /tmp/x"));
        // Shell text is left to the shell: no expansion checks.
        assert_eq!(one("RUN echo ${unclosed"), run_shell("echo ${unclosed"));
        assert_eq!(one("RUN echo 'it''s"), run_shell("echo 'it''s"));
    }

    #[test]
    fn run_exec_form() {
        assert_eq!(
            one("RUN [\"/bin/sh\", \"-c\", \"echo hi\"]"),
            Instruction::Run { command: exec(&["/bin/sh", "-c", "echo hi"]), network: None }
        );
        assert_eq!(one("RUN [ \"ls\" ,\"-l\" ]  "), Instruction::Run { command: exec(&["ls", "-l"]), network: None });
    }

    #[test]
    fn not_json_is_shell_form() {
        assert_eq!(one("RUN [ -f /etc/os-release ] && cat /etc/os-release"), run_shell("[ -f /etc/os-release ] && cat /etc/os-release"));
        assert_eq!(one("RUN ['single', 'quotes']"), run_shell("['single', 'quotes']"));
        assert_eq!(one("RUN [\"a\", 1]"), run_shell("[\"a\", 1]"));
        assert_eq!(one("CMD [\"a\"] extra"), Instruction::Cmd(shell("[\"a\"] extra")));
    }

    #[test]
    fn run_network() {
        for network in ["none", "default", "host"] {
            assert_eq!(
                one(&format!("RUN --network={network} curl example.com")),
                Instruction::Run { command: shell("curl example.com"), network: Some(network.into()) }
            );
        }
        assert_eq!(one("RUN --network=\"none\" [\"true\"]"), Instruction::Run { command: exec(&["true"]), network: Some("none".into()) });
        assert!(one_error("RUN --network=bridge true").contains("--network=bridge is not supported"));
        assert!(one_error("RUN --network true").contains("needs a value"));
        assert!(one_error("RUN --network=none --network=host true").contains("more than once"));
    }

    #[test]
    fn run_unsupported_flags() {
        assert_eq!(one_error("RUN --mount=type=cache,target=/root/.cache pip install x"), "RUN --mount is not supported");
        assert_eq!(one_error("RUN --security=insecure true"), "RUN --security is not supported");
        assert_eq!(one_error("RUN --device=/dev/fuse true"), "RUN --device is not supported");
        assert_eq!(one_error("RUN --frobnicate true"), "unknown flag --frobnicate for RUN");
    }

    #[test]
    fn run_errors() {
        assert_eq!(one_error("RUN"), "RUN needs a command");
        assert_eq!(one_error("RUN []"), "RUN needs a command");
        assert_eq!(one_error("RUN --network=none"), "RUN needs a command");
    }

    #[test]
    fn double_dash_ends_flags() {
        assert_eq!(one("RUN -- --weird-command"), run_shell("--weird-command"));
    }

    #[test]
    fn heredoc_as_the_whole_command() {
        let file = parsed("FROM alpine\nRUN <<EOF\napk add curl\necho done\nEOF\nUSER nobody\n");
        let stage = &file.stages[0];
        assert_eq!(stage.steps[0].instruction, run_shell("apk add curl\necho done\n"));
        assert_eq!(stage.steps[0].text, "RUN <<EOF\napk add curl\necho done\nEOF");
        assert_eq!(stage.steps[0].line, 2);
        assert_eq!(stage.steps[1].instruction, Instruction::User("nobody".into()));
        assert_eq!(stage.steps[1].line, 6);
    }

    #[test]
    fn heredoc_body_is_taken_verbatim() {
        // Comments, blank lines, trailing escapes and instruction-like lines
        // are all part of the body.
        let body = "# a comment\n\nFROM nothing \\\n  echo $HOME\t\n";
        let file = parsed(&format!("FROM alpine\nRUN <<EOF\n{body}EOF\n"));
        assert_eq!(file.stages[0].steps[0].instruction, run_shell(body));
    }

    #[test]
    fn heredoc_with_chomp() {
        let file = parsed("FROM alpine\nRUN <<-EOT\n\techo a\n\t\techo b\n  echo c\n\tEOT\n");
        assert_eq!(file.stages[0].steps[0].instruction, run_shell("echo a\necho b\n  echo c\n"));
    }

    #[test]
    fn heredoc_quoted_delimiters() {
        for open in ["<<\"EOF\"", "<<'EOF'", "<<E\"O\"F"] {
            let file = parsed(&format!("FROM alpine\nRUN {open}\necho $HOME\nEOF\n"));
            assert_eq!(file.stages[0].steps[0].instruction, run_shell("echo $HOME\n"), "{open}");
        }
    }

    #[test]
    fn heredoc_fed_to_a_command() {
        let file = parsed("FROM python:3.12\nRUN python3 <<'PY' > /out.txt\nprint('hi')\nPY\nRUN --network=none cat <<-EOF\n\tx\n\tEOF\n");
        let stage = &file.stages[0];
        assert_eq!(stage.steps[0].instruction, run_shell("python3 <<'PY' > /out.txt\nprint('hi')\nPY"));
        // The shell does the `<<-` tab stripping itself.
        assert_eq!(stage.steps[1].instruction, Instruction::Run { command: shell("cat <<-EOF\n\tx\nEOF"), network: Some("none".into()) });
        assert_eq!(stage.steps[1].line, 5);
    }

    #[test]
    fn heredoc_with_fd_prefix() {
        let file = parsed("FROM alpine\nRUN cat 0<<EOF\nhi\nEOF\n");
        assert_eq!(file.stages[0].steps[0].instruction, run_shell("cat 0<<EOF\nhi\nEOF"));
    }

    #[test]
    fn heredoc_with_shebang() {
        let file = parsed("FROM python:3.12\nRUN <<EOF\n#!/usr/bin/env python3\nprint('hi')\nEOF\n");
        assert_eq!(
            file.stages[0].steps[0].instruction,
            run_shell("'/usr/bin/env' 'python3' <<'EOF'\n#!/usr/bin/env python3\nprint('hi')\nEOF")
        );
        let file = parsed("FROM alpine\nRUN <<-SCRIPT\n\t#!/bin/sh -e\n\techo it's\n\tSCRIPT\n");
        assert_eq!(file.stages[0].steps[0].instruction, run_shell("'/bin/sh' '-e' <<'SCRIPT'\n#!/bin/sh -e\necho it's\nSCRIPT"));
    }

    #[test]
    fn shebang_quoting() {
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shebang_command("#!/bin/bash\necho\n", "E'F").as_deref(), Some("'/bin/bash' <<'E'\\''F'\n#!/bin/bash\necho\nE'F"));
        assert_eq!(shebang_command("#!\necho\n", "EOF"), None);
        assert_eq!(shebang_command("echo\n", "EOF"), None);
    }

    #[test]
    fn not_heredocs() {
        // `<<<` is a here-string, `cat<<EOF` is not a word of its own, and
        // quoted `<<` is text: the following lines are instructions.
        let file = parsed("FROM alpine\nRUN cat <<<hi\nRUN echo \"<<EOF\"\nRUN cat<<EOF\nUSER x\n");
        let steps = &file.stages[0].steps;
        assert_eq!(steps.len(), 4);
        assert_eq!(steps[3].instruction, Instruction::User("x".into()));
        // The exec form cannot hold one either.
        assert_eq!(one("RUN [\"cat\", \"<<EOF\"]"), Instruction::Run { command: exec(&["cat", "<<EOF"]), network: None });
    }

    #[test]
    fn heredoc_errors() {
        let e = error("FROM alpine\nRUN echo hi\nRUN <<EOF\necho never ends\n");
        assert_eq!(e.line, 3);
        assert!(e.message.contains("unterminated heredoc"), "{e}");
        let e = error("FROM alpine\nRUN cat <<A <<B\na\nA\nb\nB\n");
        assert_eq!(e.line, 2);
        assert!(e.message.contains("only one heredoc per RUN"), "{e}");
        assert!(one_error("COPY <<EOF /etc/conf\nx\nEOF").contains("COPY with a heredoc"));
        assert!(one_error("ADD <<-EOF /etc/conf\nx\nEOF").contains("ADD with a heredoc"));
        // Not in the exec form, which cannot hold one.
        match one("COPY [\"<<EOF\", \"/x\"]") {
            Instruction::Copy(spec) => assert_eq!(spec.sources, ["<<EOF"]),
            other => panic!("{other:?}"),
        }
        assert!(one_error("RUN <<\"EOF\nx\nEOF").contains("heredoc delimiter"));
    }

    #[test]
    fn copy_forms() {
        assert_eq!(
            one("COPY --from=builder --chown=1000:1000 --chmod=0755 a b* /dst/"),
            Instruction::Copy(CopySpec {
                add: false,
                sources: strings(&["a", "b*"]),
                dest: "/dst/".into(),
                from: Some("builder".into()),
                chown: Some("1000:1000".into()),
                chmod: Some("0755".into()),
            })
        );
        assert_eq!(
            one("ADD [\"my file.tar.gz\", \"$DEST\"]"),
            Instruction::Copy(CopySpec {
                add: true,
                sources: strings(&["my file.tar.gz"]),
                dest: "$DEST".into(),
                from: None,
                chown: None,
                chmod: None
            })
        );
    }

    #[test]
    fn copy_words_stay_raw() {
        match one("COPY \"my dir\"/ my\\ file ${SRC:-x} \"$DEST\"") {
            Instruction::Copy(spec) => {
                assert_eq!(spec.sources, ["\"my dir\"/", "my\\ file", "${SRC:-x}"]);
                assert_eq!(spec.dest, "\"$DEST\"");
            }
            other => panic!("{other:?}"),
        }
        match one("COPY --chown=\"$USER\" a b") {
            Instruction::Copy(spec) => assert_eq!(spec.chown.as_deref(), Some("\"$USER\"")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn copy_link_is_accepted() {
        for flag in ["--link", "--link=true", "--link=false"] {
            match one(&format!("COPY {flag} a b")) {
                Instruction::Copy(spec) => assert_eq!(spec.sources, ["a"]),
                other => panic!("{other:?}"),
            }
        }
        assert!(one_error("COPY --link=maybe a b").contains("true or false"));
    }

    #[test]
    fn copy_errors() {
        assert_eq!(one_error("COPY onlyone"), "COPY needs at least a source and a destination");
        assert_eq!(one_error("ADD"), "ADD needs at least a source and a destination");
        assert_eq!(one_error("COPY [\"a\"]"), "COPY needs at least a source and a destination");
        assert_eq!(one_error("COPY --parents a b"), "COPY --parents is not supported");
        assert_eq!(one_error("COPY --exclude=*.md a b"), "COPY --exclude is not supported");
        assert_eq!(one_error("ADD --checksum=sha256:abc https://x/y /y"), "ADD --checksum is not supported");
        assert_eq!(one_error("ADD --keep-git-dir=true git@x:y /y"), "ADD --keep-git-dir is not supported");
        assert_eq!(one_error("ADD --from=build a b"), "unknown flag --from for ADD");
        assert_eq!(one_error("COPY --from a b"), "COPY --from needs a value (--from=...)");
        assert!(one_error("COPY 'a b").contains("unterminated single quote"));
    }

    #[test]
    fn env_forms() {
        assert_eq!(one("ENV A=1"), Instruction::Env(pairs(&[("A", "1")])));
        assert_eq!(
            one("ENV A=1 B=\"two words\" C='$lit' D=${A}x E= F=a\\ b"),
            Instruction::Env(pairs(&[("A", "1"), ("B", "\"two words\""), ("C", "'$lit'"), ("D", "${A}x"), ("E", ""), ("F", "a\\ b")]))
        );
        // Legacy form: the value is the rest of the line.
        assert_eq!(one("ENV GREETING hello   big world"), Instruction::Env(pairs(&[("GREETING", "hello   big world")])));
        assert_eq!(one("ENV PATH /opt/bin:$PATH"), Instruction::Env(pairs(&[("PATH", "/opt/bin:$PATH")])));
        assert_eq!(one("ENV X=a=b"), Instruction::Env(pairs(&[("X", "a=b")])));
    }

    #[test]
    fn env_errors() {
        assert!(one_error("ENV").contains("ENV needs a name and a value"));
        assert!(one_error("ENV ONLYNAME").contains("needs a value"));
        assert!(one_error("ENV A=1 B").contains("\"B\" is not name=value"));
        assert!(one_error("ENV =1").contains("cannot be blank"));
        assert!(one_error("ENV A=\"open").contains("ENV A: unterminated double quote"));
        assert!(one_error("ENV A=${B:=x}").contains("unsupported modifier"));
        assert!(one_error("ENV --x=1 A=1").contains("unknown flag --x for ENV"));
    }

    #[test]
    fn label_forms() {
        assert_eq!(
            one("LABEL org.opencontainers.image.title=\"My App\" \"com.example.vendor\"=ACME version=1.0"),
            Instruction::Label(pairs(&[
                ("org.opencontainers.image.title", "\"My App\""),
                ("\"com.example.vendor\"", "ACME"),
                ("version", "1.0"),
            ]))
        );
        assert_eq!(one("LABEL description This is my app"), Instruction::Label(pairs(&[("description", "This is my app")])));
    }

    #[test]
    fn simple_instructions() {
        assert_eq!(one("WORKDIR /my dir/$X"), Instruction::Workdir("/my dir/$X".into()));
        assert_eq!(one("USER 1000:1000"), Instruction::User("1000:1000".into()));
        assert_eq!(one("STOPSIGNAL SIGTERM"), Instruction::StopSignal("SIGTERM".into()));
        assert_eq!(one("EXPOSE 80 443/tcp 53/udp ${PORT}"), Instruction::Expose(strings(&["80", "443/tcp", "53/udp", "${PORT}"])));
        assert_eq!(one("VOLUME /data /logs"), Instruction::Volume(strings(&["/data", "/logs"])));
        assert_eq!(one("VOLUME [\"/var/lib/db\"]"), Instruction::Volume(strings(&["/var/lib/db"])));
    }

    #[test]
    fn simple_instruction_errors() {
        assert_eq!(one_error("WORKDIR"), "WORKDIR needs a value");
        assert_eq!(one_error("USER"), "USER needs a value");
        assert_eq!(one_error("STOPSIGNAL"), "STOPSIGNAL needs a value");
        assert_eq!(one_error("EXPOSE"), "EXPOSE needs at least one port");
        assert_eq!(one_error("VOLUME"), "VOLUME needs at least one path");
        assert_eq!(one_error("VOLUME []"), "VOLUME needs at least one path");
        assert_eq!(one_error("VOLUME [\"\"]"), "VOLUME paths cannot be empty");
        assert!(one_error("WORKDIR \"/x").contains("WORKDIR: unterminated double quote"));
        assert!(one_error("USER --x=y bob").contains("unknown flag --x for USER"));
    }

    #[test]
    fn cmd_and_entrypoint() {
        assert_eq!(one("CMD python3 app.py"), Instruction::Cmd(shell("python3 app.py")));
        assert_eq!(one("CMD [\"python3\", \"app.py\"]"), Instruction::Cmd(exec(&["python3", "app.py"])));
        assert_eq!(one("CMD []"), Instruction::Cmd(exec(&[])));
        assert_eq!(one("ENTRYPOINT [\"/entrypoint.sh\"]"), Instruction::Entrypoint(exec(&["/entrypoint.sh"])));
        assert_eq!(one("ENTRYPOINT exec top -b"), Instruction::Entrypoint(shell("exec top -b")));
        assert_eq!(one_error("CMD"), "CMD needs a command");
        assert_eq!(one_error("ENTRYPOINT"), "ENTRYPOINT needs a command");
    }

    #[test]
    fn healthcheck_forms() {
        assert_eq!(one("HEALTHCHECK NONE"), Instruction::Healthcheck(Healthcheck::None));
        assert_eq!(one("healthcheck none"), Instruction::Healthcheck(Healthcheck::None));
        assert_eq!(
            one("HEALTHCHECK --interval=30s --timeout=3s --start-period=1m30s --start-interval=500ms --retries=3 CMD curl -f http://localhost/ || exit 1"),
            Instruction::Healthcheck(Healthcheck::Check {
                test: shell("curl -f http://localhost/ || exit 1"),
                interval: Some("30s".into()),
                timeout: Some("3s".into()),
                start_period: Some("1m30s".into()),
                start_interval: Some("500ms".into()),
                retries: Some("3".into()),
            })
        );
        assert_eq!(
            one("HEALTHCHECK cmd [\"/bin/check\", \"--quick\"]"),
            Instruction::Healthcheck(Healthcheck::Check {
                test: exec(&["/bin/check", "--quick"]),
                interval: None,
                timeout: None,
                start_period: None,
                start_interval: None,
                retries: None,
            })
        );
        match one("HEALTHCHECK --interval=0 --timeout=1.5s CMD true") {
            Instruction::Healthcheck(Healthcheck::Check { interval, timeout, .. }) => {
                assert_eq!(interval.as_deref(), Some("0"));
                assert_eq!(timeout.as_deref(), Some("1.5s"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn healthcheck_errors() {
        assert_eq!(one_error("HEALTHCHECK"), "HEALTHCHECK needs NONE or CMD command");
        assert_eq!(one_error("HEALTHCHECK NONE now"), "HEALTHCHECK NONE takes no arguments");
        assert_eq!(one_error("HEALTHCHECK --interval=5s NONE"), "HEALTHCHECK NONE takes no options");
        assert_eq!(one_error("HEALTHCHECK CMD"), "HEALTHCHECK CMD needs a command");
        assert_eq!(one_error("HEALTHCHECK CMD []"), "HEALTHCHECK CMD needs a command");
        assert!(one_error("HEALTHCHECK RUN true").contains("unknown type \"RUN\""));
        assert!(one_error("HEALTHCHECK --interval=5 CMD true").contains("not a duration"));
        assert!(one_error("HEALTHCHECK --interval=fast CMD true").contains("not a duration"));
        assert!(one_error("HEALTHCHECK --timeout=10us CMD true").contains("less than 1ms"));
        assert!(one_error("HEALTHCHECK --retries=-1 CMD true").contains("cannot be negative"));
        assert!(one_error("HEALTHCHECK --retries=many CMD true").contains("not a number"));
        assert!(one_error("HEALTHCHECK --every=5s CMD true").contains("unknown flag --every"));
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration_nanos("0"), Some(0.0));
        assert_eq!(go_duration_nanos("1s"), Some(1e9));
        assert_eq!(go_duration_nanos("1m30s"), Some(90e9));
        assert_eq!(go_duration_nanos("1.5h"), Some(5400e9));
        assert_eq!(go_duration_nanos(".5s"), Some(0.5e9));
        assert_eq!(go_duration_nanos("2us"), Some(2e3));
        assert_eq!(go_duration_nanos("2µs"), Some(2e3));
        assert_eq!(go_duration_nanos("-1s"), Some(-1e9));
        for bad in ["", "s", "1", "1x", "1.2.3s", ".s", "1s2", "+"] {
            assert_eq!(go_duration_nanos(bad), None, "{bad}");
        }
    }

    #[test]
    fn shell_instruction() {
        assert_eq!(
            one("SHELL [\"/bin/bash\", \"-o\", \"pipefail\", \"-c\"]"),
            Instruction::Shell(strings(&["/bin/bash", "-o", "pipefail", "-c"]))
        );
        assert!(one_error("SHELL /bin/bash -c").contains("SHELL needs the JSON form"));
        assert!(one_error("SHELL []").contains("at least the executable"));
    }

    #[test]
    fn maintainer_is_dropped() {
        let file = parsed("FROM alpine\nMAINTAINER Jane <jane@example.com>\nRUN true\n");
        assert_eq!(file.stages[0].steps.len(), 1);
        assert_eq!(file.stages[0].steps[0].line, 3);
    }

    #[test]
    fn onbuild_and_unknown_instructions() {
        assert_eq!(one_error("ONBUILD RUN make"), "ONBUILD is not supported");
        assert_eq!(one_error("FROBNICATE all the things"), "unknown instruction: FROBNICATE");
        assert_eq!(one_error("run-it now"), "unknown instruction: run-it");
        // An unknown instruction is reported as such even before FROM.
        assert_eq!(error("COPYY a b\nFROM x\n").message, "unknown instruction: COPYY");
    }

    #[test]
    fn error_line_numbers_count_continuations_comments_and_heredocs() {
        let text = "FROM python:3.12-slim\n\
                    RUN apt-get update \\\n\
                    \x20   # comment inside\n\
                    \x20   && apt-get install -y git\n\
                    RUN <<EOF\n\
                    echo one\n\
                    EOF\n\
                    \n\
                    # copy the code\n\
                    COPY src/\n";
        let e = error(text);
        assert_eq!(e.line, 10);
        assert_eq!(e.to_string(), "line 10: COPY needs at least a source and a destination");
    }

    #[test]
    fn error_in_a_continued_instruction_points_at_its_first_line() {
        let e = error("FROM a\nENV A=1 \\\n  B=2 \\\n  C\n");
        assert_eq!(e.line, 2);
    }

    #[test]
    fn step_text_joins_and_trims() {
        let file = parsed("FROM a\n  COPY   --chown=a:b \\\n\t x \\\n\n   y   \n");
        assert_eq!(file.stages[0].steps[0].text, "COPY   --chown=a:b x y");
    }

    #[test]
    fn parse_error_display() {
        let e = ParseError { line: 7, message: "COPY needs at least a source and a destination".into() };
        assert_eq!(e.to_string(), "line 7: COPY needs at least a source and a destination");
    }
}
