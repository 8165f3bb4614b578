//! Image references: `name` or `name:tag` (the tag defaults to `latest`).

use std::fmt;
use std::str::FromStr;

pub const DEFAULT_TAG: &str = "latest";
pub const MAX_NAME_LEN: usize = 128;
pub const MAX_TAG_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("invalid image reference `{reference}`: name {reason}")]
    InvalidName { reference: String, reason: &'static str },
    #[error("invalid image reference `{reference}`: tag {reason}")]
    InvalidTag { reference: String, reason: &'static str },
}

/// A validated `name:tag`.
///
/// Names are lowercase `[a-z0-9._-]` components separated by `/`; tags are
/// `[A-Za-z0-9._-]`. Neither can contain `+` or `@`, which lets the store
/// encode a reference as one flat file name without ambiguity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reference {
    name: String,
    tag: String,
}

impl Reference {
    pub fn new(name: &str, tag: &str) -> Result<Self, ReferenceError> {
        let whole = format!("{name}:{tag}");
        validate_name(name).map_err(|reason| ReferenceError::InvalidName { reference: whole.clone(), reason })?;
        validate_tag(tag).map_err(|reason| ReferenceError::InvalidTag { reference: whole, reason })?;
        Ok(Reference { name: name.to_string(), tag: tag.to_string() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn tag(&self) -> &str {
        &self.tag
    }
}

impl FromStr for Reference {
    type Err = ReferenceError;

    fn from_str(s: &str) -> Result<Self, ReferenceError> {
        // Names never contain ':', so the first ':' (if any) starts the tag.
        let (name, tag) = s.split_once(':').unwrap_or((s, DEFAULT_TAG));
        validate_name(name).map_err(|reason| ReferenceError::InvalidName { reference: s.to_string(), reason })?;
        validate_tag(tag).map_err(|reason| ReferenceError::InvalidTag { reference: s.to_string(), reason })?;
        Ok(Reference { name: name.to_string(), tag: tag.to_string() })
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

fn validate_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("is longer than 128 characters");
    }
    if !name.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' | b'/')) {
        return Err("may contain only lowercase letters, digits, '.', '_', '-' and '/'");
    }
    for component in name.split('/') {
        if component.is_empty() {
            return Err("has an empty path component (leading, trailing or double '/')");
        }
        // Components start with a letter or digit: no `.`/`..`, no hidden
        // files, nothing that looks like an option to a tool.
        if !component.as_bytes()[0].is_ascii_alphanumeric() {
            return Err("components must start with a letter or digit");
        }
    }
    Ok(())
}

fn validate_tag(tag: &str) -> Result<(), &'static str> {
    if tag.is_empty() {
        return Err("is empty");
    }
    if tag.len() > MAX_TAG_LEN {
        return Err("is longer than 128 characters");
    }
    if !tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Err("may contain only letters, digits, '.', '_' and '-'");
    }
    if !tag.as_bytes()[0].is_ascii_alphanumeric() && tag.as_bytes()[0] != b'_' {
        return Err("must start with a letter, digit or '_'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_tag() {
        let r: Reference = "python".parse().unwrap();
        assert_eq!((r.name(), r.tag()), ("python", "latest"));
        assert_eq!(r.to_string(), "python:latest");
    }

    #[test]
    fn explicit_tag_and_path_names() {
        let r: Reference = "team/swe-bench/repo_1.2:v3.1-rc_1".parse().unwrap();
        assert_eq!(r.name(), "team/swe-bench/repo_1.2");
        assert_eq!(r.tag(), "v3.1-rc_1");
        assert_eq!(r.to_string().parse::<Reference>().unwrap(), r);
        assert_eq!(Reference::new("a", "B").unwrap().to_string(), "a:B");
    }

    #[test]
    fn rejects_bad_names() {
        for bad in ["", "Python", "a b", "/abs", "trail/", "a//b", "../x", "a/./b", ".hidden", "-opt", "a@b", "a+b", "ümlaut", ":tag"] {
            match bad.parse::<Reference>() {
                Err(ReferenceError::InvalidName { reference, .. }) => assert_eq!(reference, bad),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        assert!("a".repeat(128).parse::<Reference>().is_ok());
        assert!("a".repeat(129).parse::<Reference>().is_err());
    }

    #[test]
    fn rejects_bad_tags() {
        for bad in ["a:", "a:b:c", "a:.x", "a:-x", "a:x/y", "a:x@y"] {
            assert!(matches!(bad.parse::<Reference>(), Err(ReferenceError::InvalidTag { .. })), "{bad}");
        }
        assert!(format!("a:{}", "t".repeat(129)).parse::<Reference>().is_err());
        let msg = "a:x/y".parse::<Reference>().unwrap_err().to_string();
        assert!(msg.contains("a:x/y") && msg.contains("tag"), "{msg}");
    }
}
