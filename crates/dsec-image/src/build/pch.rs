//! The judge image's precompiled `<bits/stdc++.h>`.
//!
//! Most competitive-programming C++ starts with `#include <bits/stdc++.h>`
//! (the whole standard library), and g++ spends seconds parsing it on
//! every compile: 2.6 s of a 2.7 s compile on this project's test machine,
//! against 0.5 s with the header precompiled. g++ uses `HEADER.gch` in
//! place of a header it finds beside it when the `.gch` was made with the
//! same language and code-generation options, so the judge image carries
//! one made with exactly the flags FnCall compiles C++ with
//! ([`CPP_FLAGS`], from the runners' language table in dsec-fncall-runner).
//! A source that does not include it, or a compile with other flags,
//! simply parses headers as before.

use std::fs;
use std::path::Path;
use std::process::Command;

use dsec_fncall_runner::CPP_FLAGS;

use super::tool::{self, CHROOT};
use super::{io_err, BuildError};
use crate::progress::Progress;

/// A source that includes the header, for g++ to say (`-H`) which header
/// file, or which precompiled one, it reads. Inside the image's `/tmp`.
const PROBE: &str = "tmp/dsec-pch-probe.cpp";

/// Precompiles `<bits/stdc++.h>` in the tree at `root` (which has g++),
/// next to the header g++ finds, and checks that g++ then uses it.
pub(crate) fn precompile_stdcpp(root: &Path, progress: &dyn Progress) -> Result<(), BuildError> {
    let probe = root.join(PROBE);
    fs::write(&probe, "#include <bits/stdc++.h>\n").map_err(io_err("writing", &probe))?;
    let outcome = precompile_with_probe(root, progress);
    let removed = fs::remove_file(&probe).map_err(io_err("removing", &probe));
    outcome.and(removed)
}

fn precompile_with_probe(root: &Path, progress: &dyn Progress) -> Result<(), BuildError> {
    let header = match first_include(root)? {
        ('.', path) => path,
        (_, path) => return Err(BuildError::PrecompiledHeader(format!("g++ reads `{path}` for it before one was made"))),
    };
    let gch = format!("{header}.gch");
    progress.stage(&format!("precompiling <bits/stdc++.h> (g++ {})", CPP_FLAGS.join(" ")));
    gxx(root, &["-x", "c++-header", &header, "-o", &gch])?;
    match first_include(root)? {
        ('!', path) if path == gch => Ok(()),
        (mark, path) => {
            Err(BuildError::PrecompiledHeader(format!("g++ does not use `{gch}` once made: its first include is `{mark} {path}`")))
        }
    }
}

/// The first line of `g++ -H` on the probe: `. PATH` for a header read, `!
/// PATH` for a valid precompiled header used, `x PATH` for one refused.
fn first_include(root: &Path) -> Result<(char, String), BuildError> {
    let lines = gxx(root, &["-H", "-fsyntax-only", &format!("/{PROBE}")])?;
    let first = lines.first().map(String::as_str).unwrap_or("");
    let mut chars = first.chars();
    match (chars.next(), chars.next()) {
        (Some(mark @ ('.' | '!' | 'x')), Some(' ')) => Ok((mark, chars.as_str().to_string())),
        _ => Err(BuildError::PrecompiledHeader(format!("unexpected `g++ -H` output `{first}`"))),
    }
}

/// `g++ CPP_FLAGS ARGS` inside `root` (chroot), with a fixed
/// environment; its output lines (stdout and stderr). The PATH is also
/// where `chroot` itself is looked up, on the host.
fn gxx(root: &Path, args: &[&str]) -> Result<Vec<String>, BuildError> {
    let mut cmd = Command::new(CHROOT.name);
    cmd.arg(root).arg("g++").args(CPP_FLAGS).args(args);
    cmd.env_clear().env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin").env("LC_ALL", "C");
    tool::run(&CHROOT, cmd, None)
}
