//! The languages a runner serves and how each runs.
//!
//! Argument lists may hold placeholders, filled per step (`argv`):
//! `{FILE}` the source file's name in scratch, `{MAIN}` a Java program's
//! main class, `{PROG}` the installed compiled program, `{MEM_MB}` the
//! step's memory limit in MiB (an argument holding it is left out when
//! the step has no memory limit), `{JAVAC_CDS}` and `{JAVA_CDS}` the judge
//! image's class-data-sharing archives for javac and for Java programs
//! (an argument holding one is left out when the image has none).

use crate::java_class;
use crate::sys::which;
use crate::PROG_DIR;

/// How a step's memory limit holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryCap {
    /// RLIMIT_AS: an allocation past the limit fails inside the program
    /// (MemoryError, bad_alloc, a NULL from malloc).
    AddressSpace,
    /// The runtime's own heap limit where it has one (its flags or
    /// environment, with `{MEM_MB}`), and a run whose peak resident memory
    /// passed the limit is a memory-limit exceedance whatever its exit.
    /// The JVM, V8 and Go's runtime reserve far more address space than
    /// they use (a JVM's code cache alone reserves 240 MiB), and PHP and
    /// Ruby map 50-60 MiB before a program's first line (PHP's ICU data
    /// alone is 30 MiB), so an RLIMIT_AS of the limit would keep them from
    /// starting; the runner's memory cgroup bounds them, and its OOM
    /// killer picks the call first (oom_score_adj 1000).
    Runtime,
}

pub struct Lang {
    pub name: &'static str,
    /// The source file's name in scratch (Java: `source_file`).
    file: &'static str,
    /// The compile step's argv (its program looked up in PATH), for
    /// compiled languages; it leaves the program at scratch/prog.
    compile: Option<&'static [&'static str]>,
    /// How a compiled program runs (`{PROG}`): exec'd itself if None.
    run_compiled: Option<&'static [&'static str]>,
    /// Runs in the zygote's warm interpreter.
    pub python: bool,
    /// The argv that runs the source otherwise (interpreted languages).
    interpreter: Option<&'static [&'static str]>,
    /// Added to the steps' environment (the request's own variables win).
    pub env: &'static [(&'static str, &'static str)],
    pub memory: MemoryCap,
    /// The program whose presence in the image means it has the language.
    tool: &'static str,
}

/// A Python call's file in scratch (the name its tracebacks show).
pub const PYTHON_FILE: &str = "main.py";

/// C++'s compile options besides its file names. The judge image's build
/// (dsec-image's `build::pch`) precompiles `<bits/stdc++.h>` with these, and
/// g++ uses a precompiled header only under the options it was made with.
pub const CPP_FLAGS: [&str; 2] = ["-O2", "-std=gnu++17"];

/// The judge image's class-data-sharing archives, which its build
/// (dsec-image's `build::java_cds`) makes: JVMs that map them start sooner.
/// javac's archive is made under JAVAC_JVM_FLAGS.
pub const JAVAC_CDS_ARCHIVE: &str = "/usr/lib/dsec-judge/javac.jsa";
pub const JAVA_CDS_ARCHIVE: &str = "/usr/lib/dsec-judge/java.jsa";

/// The options of javac's JVM: the serial collector and the client
/// compiler start javac soonest; no JVM of a call writes its performance
/// counters to /tmp (-XX:-UsePerfData), which would leave the monitor a
/// file to sweep after every call.
pub const JAVAC_JVM_FLAGS: [&str; 3] = ["-J-XX:+UseSerialGC", "-J-XX:TieredStopAtLevel=1", "-J-XX:-UsePerfData"];

// The cpp and java entries of LANGS name each of these flags.
const _: () = assert!(CPP_FLAGS.len() == 2 && JAVAC_JVM_FLAGS.len() == 3, "LANGS lists every flag");

/// Java's compile step: javac, then the classes packed with their entry
/// point into one jar at scratch/prog (by Python's zipfile: a `jar` would
/// start a second JVM), so that the compile cache and the install step
/// keep one file, as for native programs. Arguments: the source file, the
/// main class, JAVA_JAR, then javac's options.
const JAVA_COMPILE: &str = "f=$1 m=$2 z=$3; shift 3; \
     javac \"$@\" -encoding UTF-8 -d classes \"$f\" \
     && python3 -I -c \"$z\" \"$m\"";

/// Writes the jar: a manifest naming the main class, then every class
/// under `classes`, in a fixed order.
const JAVA_JAR: &str = "import os, sys, zipfile
with zipfile.ZipFile('prog', 'w', zipfile.ZIP_DEFLATED) as z:
    z.writestr('META-INF/MANIFEST.MF', 'Manifest-Version: 1.0\\r\\nMain-Class: %s\\r\\n\\r\\n' % sys.argv[1])
    for d, dirs, files in os.walk('classes'):
        dirs.sort()
        for f in sorted(files):
            z.write(os.path.join(d, f), os.path.relpath(os.path.join(d, f), 'classes'))
";

const LANGS: [Lang; 12] = [
    Lang {
        name: "python",
        file: PYTHON_FILE,
        compile: None,
        run_compiled: None,
        python: true,
        interpreter: None,
        env: &[],
        memory: MemoryCap::AddressSpace,
        tool: "python3",
    },
    Lang {
        name: "bash",
        file: "main.sh",
        compile: None,
        run_compiled: None,
        python: false,
        interpreter: Some(&["bash", "{FILE}"]),
        env: &[],
        memory: MemoryCap::AddressSpace,
        tool: "bash",
    },
    Lang {
        name: "c",
        file: "main.c",
        compile: Some(&["gcc", "-O2", "-std=gnu17", "-o", "prog", "{FILE}", "-lm"]),
        run_compiled: None,
        python: false,
        interpreter: None,
        env: &[],
        memory: MemoryCap::AddressSpace,
        tool: "gcc",
    },
    Lang {
        name: "cpp",
        file: "main.cpp",
        compile: Some(&["g++", CPP_FLAGS[0], CPP_FLAGS[1], "-o", "prog", "{FILE}"]),
        run_compiled: None,
        python: false,
        interpreter: None,
        env: &[],
        memory: MemoryCap::AddressSpace,
        tool: "g++",
    },
    Lang {
        name: "java",
        file: "Main.java",
        compile: Some(&[
            "sh",
            "-c",
            JAVA_COMPILE,
            "javac",
            "{FILE}",
            "{MAIN}",
            JAVA_JAR,
            JAVAC_JVM_FLAGS[0],
            JAVAC_JVM_FLAGS[1],
            JAVAC_JVM_FLAGS[2],
            "-J-XX:SharedArchiveFile={JAVAC_CDS}",
        ]),
        // -Xss: deep recursion is common in judge solutions, and the main
        // thread's default 1 MiB stack is smaller than a C program's 8.
        // An archive the JVM cannot use is skipped without a word on the
        // program's stderr (-Xlog:cds).
        run_compiled: Some(&[
            "java",
            "-XX:+UseSerialGC",
            "-XX:-UsePerfData",
            "-XX:SharedArchiveFile={JAVA_CDS}",
            "-Xlog:cds=off,cds+dynamic=off",
            "-Xss64m",
            "-Xmx{MEM_MB}m",
            "-jar",
            "{PROG}",
        ]),
        python: false,
        interpreter: None,
        env: &[],
        memory: MemoryCap::Runtime,
        tool: "javac",
    },
    Lang {
        name: "javascript",
        file: "main.js",
        compile: None,
        run_compiled: None,
        python: false,
        interpreter: Some(&["node", "--max-old-space-size={MEM_MB}", "{FILE}"]),
        env: &[],
        memory: MemoryCap::Runtime,
        tool: "node",
    },
    Lang {
        name: "go",
        file: "main.go",
        compile: Some(&["go", "build", "-o", "prog", "{FILE}"]),
        run_compiled: None,
        python: false,
        interpreter: None,
        // The build's cache is scratch's (HOME), gone with the call; no
        // module download is ever tried (there is no network anyway). The
        // run's collector works harder as the heap nears the limit.
        env: &[("GOPROXY", "off"), ("GOMEMLIMIT", "{MEM_MB}MiB")],
        memory: MemoryCap::Runtime,
        tool: "go",
    },
    Lang {
        name: "rust",
        file: "main.rs",
        // No cargo: a judge program is one file using std alone, and
        // cargo would look for a registry. gold, without the standard
        // library's debug info, links in ~30 ms where ld.bfd took ~250:
        // a compile of a small program took 450 ms instead of 680.
        compile: Some(&[
            "rustc",
            "-O",
            "--edition",
            "2021",
            "-C",
            "link-arg=-fuse-ld=gold",
            "-C",
            "strip=debuginfo",
            "-o",
            "prog",
            "{FILE}",
        ]),
        run_compiled: None,
        python: false,
        interpreter: None,
        env: &[],
        memory: MemoryCap::AddressSpace,
        tool: "rustc",
    },
    // PHP and Ruby: see MemoryCap::Runtime (neither starts under an
    // RLIMIT_AS of 48 MiB). Debian's PHP CLI sets no memory_limit of its
    // own, and Ruby has none.
    Lang {
        name: "php",
        file: "main.php",
        compile: None,
        run_compiled: None,
        python: false,
        interpreter: Some(&["php", "{FILE}"]),
        env: &[],
        memory: MemoryCap::Runtime,
        tool: "php",
    },
    Lang {
        name: "ruby",
        file: "main.rb",
        compile: None,
        run_compiled: None,
        python: false,
        interpreter: Some(&["ruby", "{FILE}"]),
        env: &[],
        memory: MemoryCap::Runtime,
        tool: "ruby",
    },
    // Perl and Lua start in a few MiB: RLIMIT_AS holds their limit as it
    // does C's.
    Lang {
        name: "perl",
        file: "main.pl",
        compile: None,
        run_compiled: None,
        python: false,
        interpreter: Some(&["perl", "{FILE}"]),
        env: &[],
        memory: MemoryCap::AddressSpace,
        tool: "perl",
    },
    Lang {
        name: "lua",
        file: "main.lua",
        compile: None,
        run_compiled: None,
        python: false,
        interpreter: Some(&["lua5.4", "{FILE}"]),
        env: &[],
        memory: MemoryCap::AddressSpace,
        tool: "lua5.4",
    },
];

impl Lang {
    pub fn named(name: &str) -> Option<&'static Lang> {
        LANGS.iter().find(|l| l.name == name)
    }

    pub fn is_compiled(&self) -> bool {
        self.compile.is_some()
    }

    /// The file the source is written to in scratch and the program's
    /// entry point: for Java, the file its public class needs and that
    /// class in its package (`java_class`); for the others, their file
    /// and nothing.
    pub fn source_file(&self, source: &str) -> (String, String) {
        match self.name {
            "java" => {
                let main = java_class::main_class(source);
                (format!("{}.java", main.class), main.qualified)
            }
            _ => (self.file.to_string(), String::new()),
        }
    }

    /// The compile step's argv, its program found in PATH.
    pub fn compile_argv(&self, file: &str, main: &str) -> Option<Vec<String>> {
        self.compile.map(|argv| resolve(&fill(argv, file, main, 0)))
    }

    /// The run step's argv: the installed program, the interpreter on
    /// the source, or None for Python (the warm interpreter).
    pub fn run_argv(&self, file: &str, memory_bytes: u64) -> Option<Vec<String>> {
        if self.compile.is_some() {
            return Some(match self.run_compiled {
                Some(argv) => resolve(&fill(argv, file, "", memory_bytes)),
                None => vec![format!("{PROG_DIR}/prog")],
            });
        }
        self.interpreter.map(|argv| resolve(&fill(argv, file, "", memory_bytes)))
    }

    /// The language's own variables for a step with this memory limit.
    pub fn step_env(&self, memory_bytes: u64) -> impl Iterator<Item = (String, String)> + '_ {
        self.env.iter().filter_map(move |(k, v)| Some((k.to_string(), fill_one(v, "", "", memory_bytes)?)))
    }

    /// The RLIMIT_AS a step of this language gets for a limit of
    /// `memory_bytes` (0: none).
    pub fn address_space_limit(&self, memory_bytes: u64) -> u64 {
        match self.memory {
            MemoryCap::AddressSpace => memory_bytes,
            MemoryCap::Runtime => 0,
        }
    }

    /// Whether a run that peaked at `peak_kb` of resident memory went past
    /// `memory_bytes`, for a language whose limit RLIMIT_AS does not hold.
    pub fn exceeded(&self, memory_bytes: u64, peak_kb: u64) -> bool {
        self.memory == MemoryCap::Runtime && memory_bytes > 0 && peak_kb.saturating_mul(1024) > memory_bytes
    }
}

/// `template` with its placeholders filled; an argument that needs
/// `{MEM_MB}` is left out when there is no memory limit.
fn fill(template: &[&str], file: &str, main: &str, memory_bytes: u64) -> Vec<String> {
    template.iter().filter_map(|a| fill_one(a, file, main, memory_bytes)).collect()
}

fn fill_one(arg: &str, file: &str, main: &str, memory_bytes: u64) -> Option<String> {
    if arg.contains("{MEM_MB}") && memory_bytes == 0 {
        return None;
    }
    for (name, path) in [("{JAVAC_CDS}", JAVAC_CDS_ARCHIVE), ("{JAVA_CDS}", JAVA_CDS_ARCHIVE)] {
        if arg.contains(name) {
            // One stat per Java step, against a JVM's ~0.1 s start.
            return std::path::Path::new(path).exists().then(|| arg.replace(name, path));
        }
    }
    let mb = (memory_bytes >> 20).max(1).to_string();
    let prog = format!("{PROG_DIR}/prog");
    Some(arg.replace("{FILE}", file).replace("{PROG}", &prog).replace("{MAIN}", main).replace("{MEM_MB}", &mb))
}

/// Every language a runner can serve, in the table's order.
pub fn languages() -> impl Iterator<Item = &'static str> {
    LANGS.iter().map(|l| l.name)
}

/// Whether `language` is one of the table's and has a compile step.
pub fn is_compiled(language: &str) -> bool {
    Lang::named(language).is_some_and(Lang::is_compiled)
}

/// The languages this image can run: those whose tool is there, Python
/// too if the image has it (`python`).
pub fn available(python: bool) -> Vec<&'static str> {
    LANGS.iter().filter(|l| if l.python { python } else { which(l.tool).is_some() }).map(|l| l.name).collect()
}

/// `argv` with its program found in PATH (left as is if not found: the
/// worker's exec then fails and says so on the call's stderr).
fn resolve(argv: &[String]) -> Vec<String> {
    let mut out = argv.to_vec();
    if let Some(p) = which(&argv[0]) {
        out[0] = p;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_and_their_steps() {
        assert!(Lang::named("python").unwrap().python);
        assert!(Lang::named("python").unwrap().run_argv("main.py", 1 << 20).is_none());
        assert_eq!(Lang::named("cpp").unwrap().compile.unwrap()[0], "g++");
        assert!(Lang::named("cobol").is_none());
        assert_eq!(available(true)[0], "python");
        assert!(!available(false).contains(&"python"));
        let argv = Lang::named("bash").unwrap().run_argv("main.sh", 0).unwrap();
        assert!(argv[0].ends_with("/bash") && argv[1] == "main.sh", "{argv:?}");
        assert_eq!(resolve(&["no-such-tool-here".into(), "x".into()]), vec!["no-such-tool-here", "x"]);
        let c = Lang::named("c").unwrap();
        assert_eq!(c.run_argv("main.c", 64 << 20).unwrap(), vec![format!("{PROG_DIR}/prog")]);
        assert_eq!(c.compile_argv("main.c", "").unwrap()[5], "main.c");
        let rust = Lang::named("rust").unwrap();
        assert!(rust.is_compiled() && rust.compile_argv("main.rs", "").unwrap().ends_with(&["prog".into(), "main.rs".into()]));
        assert_eq!(rust.address_space_limit(64 << 20), 64 << 20);
        for (name, program, cap) in [
            ("php", "php", MemoryCap::Runtime),
            ("ruby", "ruby", MemoryCap::Runtime),
            ("perl", "perl", MemoryCap::AddressSpace),
            ("lua", "lua5.4", MemoryCap::AddressSpace),
        ] {
            let l = Lang::named(name).unwrap();
            let (file, _) = l.source_file("");
            let argv = l.run_argv(&file, 64 << 20).unwrap();
            assert!(!l.is_compiled() && argv[0].ends_with(program) && argv[1] == file, "{name}: {argv:?}");
            assert_eq!(l.memory, cap, "{name}");
        }
    }

    #[test]
    fn managed_runtimes_get_their_limit_as_flags_not_as_address_space() {
        let java = Lang::named("java").unwrap();
        let run = java.run_argv("Main.java", 256 << 20).unwrap();
        assert!(run.contains(&"-Xmx256m".to_string()) && run.last().unwrap() == &format!("{PROG_DIR}/prog"), "{run:?}");
        assert!(!java.run_argv("Main.java", 0).unwrap().iter().any(|a| a.starts_with("-Xmx")));
        assert_eq!(java.address_space_limit(256 << 20), 0);
        assert_eq!(Lang::named("c").unwrap().address_space_limit(256 << 20), 256 << 20);
        let (file, main) = java.source_file("package a.b;\npublic class Solution {}");
        assert_eq!((file.as_str(), main.as_str()), ("Solution.java", "a.b.Solution"));
        let compile = java.compile_argv(&file, &main).unwrap();
        assert_eq!(&compile[4..6], ["Solution.java", "a.b.Solution"], "{compile:?}");
        let node = Lang::named("javascript").unwrap().run_argv("main.js", 100 << 20).unwrap();
        assert_eq!(&node[1..], ["--max-old-space-size=100", "main.js"]);
        let go_env: Vec<_> = Lang::named("go").unwrap().step_env(64 << 20).collect();
        assert!(go_env.contains(&("GOMEMLIMIT".into(), "64MiB".into())), "{go_env:?}");
        assert!(!Lang::named("go").unwrap().step_env(0).any(|(k, _)| k == "GOMEMLIMIT"));
        assert!(java.exceeded(64 << 20, 70_000) && !java.exceeded(64 << 20, 60_000) && !java.exceeded(0, 1 << 30));
        assert!(!Lang::named("c").unwrap().exceeded(64 << 20, 70_000), "RLIMIT_AS holds C's limit");
    }

    #[test]
    fn java_steps_leave_out_class_archives_the_image_lacks() {
        // Left out where the image has none (this host).
        if !std::path::Path::new(JAVA_CDS_ARCHIVE).exists() {
            let run = Lang::named("java").unwrap().run_argv("Main.java", 1 << 20).unwrap();
            assert!(!run.iter().any(|a| a.contains("SharedArchiveFile")), "{run:?}");
        }
    }
}
