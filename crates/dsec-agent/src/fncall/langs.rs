//! The languages a runner serves and how each runs.

use super::sys::which;

pub struct Lang {
    pub name: &'static str,
    /// The source file's name in scratch.
    pub file: &'static str,
    /// The compile step's argv (its program looked up in PATH), for
    /// compiled languages; the run step then execs the installed program.
    pub compile: Option<&'static [&'static str]>,
    /// Runs in the zygote's warm interpreter.
    pub python: bool,
    /// The interpreter that runs `file` otherwise.
    pub interpreter: Option<&'static str>,
}

/// A Python call's file in scratch (the name its tracebacks show).
pub const PYTHON_FILE: &str = "main.py";

const LANGS: [Lang; 4] = [
    Lang { name: "python", file: PYTHON_FILE, compile: None, python: true, interpreter: None },
    Lang { name: "bash", file: "main.sh", compile: None, python: false, interpreter: Some("bash") },
    Lang { name: "c", file: "main.c", compile: Some(&["gcc", "-O2", "-std=gnu17", "-o", "prog", "main.c", "-lm"]), python: false, interpreter: None },
    // The judge image's precompiled <bits/stdc++.h> is made with exactly
    // these options (dsec-image's CPP_PCH_FLAGS; a test holds them equal).
    Lang { name: "cpp", file: "main.cpp", compile: Some(&["g++", "-O2", "-std=gnu++17", "-o", "prog", "main.cpp"]), python: false, interpreter: None },
];

impl Lang {
    pub fn named(name: &str) -> Option<&'static Lang> {
        LANGS.iter().find(|l| l.name == name)
    }
}

/// The languages this image can run: Python always (the zygote is
/// Python), the others if their tool is there.
pub fn available() -> Vec<&'static str> {
    let mut out = vec!["python"];
    for (lang, tool) in [("bash", "bash"), ("c", "gcc"), ("cpp", "g++")] {
        if which(tool).is_some() {
            out.push(lang);
        }
    }
    out
}

/// `argv` with its program found in PATH (left as is if not found: the
/// worker's exec then fails and says so on the call's stderr).
pub fn resolve(argv: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    if let Some(p) = which(argv[0]) {
        out[0] = p;
    }
    out
}

/// How an interpreted language other than Python runs its file.
pub fn interpreter_argv(lang: &Lang) -> Vec<String> {
    let tool = lang.interpreter.unwrap_or("bash");
    vec![which(tool).unwrap_or_else(|| format!("/bin/{tool}")), lang.file.to_string()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_and_their_steps() {
        assert!(Lang::named("python").unwrap().python);
        assert_eq!(Lang::named("cpp").unwrap().compile.unwrap()[0], "g++");
        assert!(Lang::named("java").is_none());
        assert_eq!(available()[0], "python");
        let argv = interpreter_argv(Lang::named("bash").unwrap());
        assert!(argv[0].ends_with("/bash") && argv[1] == "main.sh", "{argv:?}");
        assert_eq!(resolve(&["no-such-tool-here", "x"]), vec!["no-such-tool-here", "x"]);
    }

    /// The judge image's precompiled <bits/stdc++.h> is used only by a
    /// compile with the options it was made with.
    #[test]
    fn cpp_compiles_with_the_options_of_the_judge_images_precompiled_header() {
        let argv = Lang::named("cpp").unwrap().compile.unwrap();
        let options: Vec<&str> = argv[1..].iter().copied().filter(|a| !["-o", "prog", "main.cpp"].contains(a)).collect();
        assert_eq!(options, dsec_image::build::CPP_PCH_FLAGS);
    }
}
