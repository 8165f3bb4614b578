//! Masquerading of what leaves the node from the sandbox subnet.
//!
//! Sandbox addresses are private to the node: a mirror beyond it has no
//! route back to them. With `"nat": true` the edge adds one POSTROUTING
//! rule (source the subnet, destination outside it) while it runs, so
//! replies come back to the node's own address and the kernel's connection
//! tracking hands them to the sandbox. The rule is added with the host's
//! `iptables` (its nftables backend on Debian): once at start, once at
//! shutdown, never per sandbox, so the cost of a process does not matter
//! and the rule stays readable to an operator (`iptables -t nat -S`).

use std::process::Command;

use crate::rules::Cidr;

/// The rule's arguments after the action (`-A`, `-C`, `-D`).
fn rule(subnet: Cidr, tag: &str) -> Vec<String> {
    let s = subnet.to_string();
    ["POSTROUTING", "-s", &s, "!", "-d", &s, "-m", "comment", "--comment", &format!("dsec node {tag}"), "-j", "MASQUERADE"]
        .iter()
        .map(|a| a.to_string())
        .collect()
}

fn iptables(action: &str, subnet: Cidr, tag: &str) -> std::io::Result<std::process::Output> {
    Command::new("iptables").args(["-w", "-t", "nat", action]).args(rule(subnet, tag)).output()
}

/// Adds the rule unless it is there (an edge that crashed left it).
pub(crate) fn masquerade(subnet: Cidr, tag: &str) -> std::io::Result<()> {
    if iptables("-C", subnet, tag)?.status.success() {
        return Ok(());
    }
    let out = iptables("-A", subnet, tag)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("iptables -t nat -A: {}", String::from_utf8_lossy(&out.stderr).trim())))
    }
}

/// Removes the rule (every copy of it); a missing rule is no error.
pub(crate) fn unmasquerade(subnet: Cidr, tag: &str) {
    for _ in 0..8 {
        match iptables("-D", subnet, tag) {
            Ok(out) if out.status.success() => continue,
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_spares_the_subnet_itself_and_names_its_node() {
        let r = rule("10.213.0.0/16".parse().unwrap(), "ab12").join(" ");
        assert_eq!(r, "POSTROUTING -s 10.213.0.0/16 ! -d 10.213.0.0/16 -m comment --comment dsec node ab12 -j MASQUERADE");
    }
}
