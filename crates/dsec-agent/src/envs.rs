//! Environment lists: layering (image, user, session, request) and checks.

use std::ffi::CString;

use dsec_agent_proto::AgentError;

use crate::errors::invalid;
use crate::users::User;

/// An ordered environment; later layers replace earlier values in place so
/// the order stays stable (and the output deterministic).
pub type Env = Vec<(String, String)>;

/// What a command gets when nothing sets PATH (Docker's default).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub fn get<'a>(env: &'a Env, key: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

pub fn set(env: &mut Env, key: &str, value: &str) {
    match env.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value.to_string(),
        None => env.push((key.to_string(), value.to_string())),
    }
}

pub fn remove(env: &mut Env, key: &str) {
    env.retain(|(k, _)| k != key);
}

pub fn overlay(env: &mut Env, layer: &[(String, String)]) {
    for (k, v) in layer {
        set(env, k, v);
    }
}

/// A name must be non-empty and free of `=` and NUL; a value free of NUL.
pub fn validate(layer: &[(String, String)]) -> Result<(), AgentError> {
    for (k, v) in layer {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(invalid(format!("invalid environment variable name {k:?}")));
        }
        if v.contains('\0') {
            return Err(invalid(format!("environment variable {k} contains a NUL byte")));
        }
    }
    Ok(())
}

/// HOME, USER and LOGNAME for `user`, as login(1) would set them.
pub fn user_vars(env: &mut Env, user: &User) {
    set(env, "HOME", &user.home);
    match &user.name {
        Some(name) => {
            set(env, "USER", name);
            set(env, "LOGNAME", name);
        }
        None => {
            remove(env, "USER");
            remove(env, "LOGNAME");
        }
    }
}

/// The environment every command starts from: the image's, the user's
/// identity, and a PATH if the image gave none.
pub fn base(image: &[(String, String)], user: &User) -> Env {
    let mut env: Env = image.to_vec();
    user_vars(&mut env, user);
    if get(&env, "PATH").is_none() {
        set(&mut env, "PATH", DEFAULT_PATH);
    }
    env
}

/// `KEY=VALUE` C strings for execve (validated beforehand, so no NUL).
pub fn to_cstrings(env: &Env) -> Result<Vec<CString>, AgentError> {
    env.iter()
        .map(|(k, v)| CString::new(format!("{k}={v}")).map_err(|_| invalid(format!("environment variable {k} contains a NUL byte"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(pairs: &[(&str, &str)]) -> Env {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn layers_override_in_place() {
        let mut env = e(&[("A", "1"), ("B", "2")]);
        overlay(&mut env, &e(&[("B", "3"), ("C", "4")]));
        assert_eq!(env, e(&[("A", "1"), ("B", "3"), ("C", "4")]));
        remove(&mut env, "A");
        assert_eq!(get(&env, "A"), None);
        assert_eq!(get(&env, "C"), Some("4"));
    }

    #[test]
    fn base_adds_user_and_path() {
        let user = User::root();
        let env = base(&e(&[("LANG", "C.UTF-8")]), &user);
        assert_eq!(get(&env, "HOME"), Some("/root"));
        assert_eq!(get(&env, "USER"), Some("root"));
        assert_eq!(get(&env, "LOGNAME"), Some("root"));
        assert_eq!(get(&env, "PATH"), Some(DEFAULT_PATH));
        let env = base(&e(&[("PATH", "/opt/bin")]), &user);
        assert_eq!(get(&env, "PATH"), Some("/opt/bin"));
    }

    #[test]
    fn bad_names_and_values_are_refused() {
        assert!(validate(&e(&[("OK_1", "x=y")])).is_ok());
        for bad in [e(&[("", "x")]), e(&[("A=B", "x")]), e(&[("A\0", "x")]), e(&[("A", "x\0")])] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
        let c = to_cstrings(&e(&[("A", "b=c")])).unwrap();
        assert_eq!(c[0].to_bytes(), b"A=b=c");
    }
}
