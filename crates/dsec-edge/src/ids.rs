//! Sandbox ids encode the node that owns the sandbox, so a stateless
//! apiserver can route any request by the id alone: `<node>.<random>`.

use rand::Rng;

const ALPHABET: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz"; // Crockford base32, lowercase
const RANDOM_CHARS: usize = 12; // 60 bits

/// Node names: 1-32 of [a-z0-9-], starting with a letter or digit.
pub fn validate_node_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!("node name {name:?} must be 1-32 characters of a-z, 0-9 and '-', not starting with '-'"))
    }
}

pub fn new_sandbox_id(node: &str) -> String {
    let mut rng = rand::rng();
    let mut id = String::with_capacity(node.len() + 1 + RANDOM_CHARS);
    id.push_str(node);
    id.push('.');
    for _ in 0..RANDOM_CHARS {
        id.push(ALPHABET[rng.random_range(0..ALPHABET.len())] as char);
    }
    id
}

/// The node encoded in a sandbox id, if the id is well formed.
pub fn node_of(id: &str) -> Option<&str> {
    let (node, rest) = id.split_once('.')?;
    let well_formed = validate_node_name(node).is_ok() && rest.len() == RANDOM_CHARS && rest.bytes().all(|b| ALPHABET.contains(&b));
    well_formed.then_some(node)
}

/// The short part of the id, used as the sandbox's hostname.
pub fn short_id(id: &str) -> &str {
    id.split_once('.').map(|(_, r)| r).unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_their_node() {
        let id = new_sandbox_id("node-7");
        assert_eq!(node_of(&id), Some("node-7"));
        assert_eq!(short_id(&id).len(), RANDOM_CHARS);
        assert_ne!(new_sandbox_id("n"), new_sandbox_id("n"));
    }

    #[test]
    fn malformed_ids_have_no_node() {
        for bad in ["", "abc", "node.", ".abcdefghjkmn", "Node.abcdefghjkmn", "n.abc", "n/x.abcdefghjkmn", "n.abcdefghjkmi"] {
            assert_eq!(node_of(bad), None, "{bad}");
        }
    }
}
