//! `dsec project create|ls|show|quota|rm` and `dsec token create|ls|revoke`:
//! projects, their quotas and scoped tokens.

use clap::{Args, Subcommand};
use dsec_api as api;

use crate::connect::ConnectArgs;

#[derive(Args)]
pub struct ProjectArgs {
    #[command(subcommand)]
    pub cmd: ProjectCmd,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Subcommand)]
pub enum ProjectCmd {
    /// Create a project: a path like `team-rl/exp-42` (its parent must exist).
    Create {
        name: String,
        /// Limits, e.g. `sandboxes=2000,cpu=500,memory=2TiB,disk=20TiB,creations_per_s=200,fncall_per_s=5000`
        /// (memory and disk in MiB unless given a unit).
        #[arg(long)]
        quota: Option<String>,
        /// Give it more than its parent has not handed out yet.
        #[arg(long)]
        overcommit: bool,
    },
    /// The projects your token reaches.
    Ls,
    /// A project's quota and its use of each limit.
    Show { name: String },
    /// Set a project's quota (replacing it); `--clear` removes it.
    Quota {
        name: String,
        #[arg(required_unless_present = "clear")]
        quota: Option<String>,
        #[arg(long)]
        overcommit: bool,
        #[arg(long, conflicts_with = "quota")]
        clear: bool,
    },
    /// Delete projects (no sub-projects, no live sandboxes); their tokens stop working.
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub cmd: TokenCmd,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Issue a token for a project (yours or below it); prints it once.
    Create {
        project: String,
        /// admin, builder or solver (at most what your token holds; default: its role).
        #[arg(long)]
        role: Option<String>,
        /// Lifetime: `90s`, `30m`, `24h`, `7d` (at most what your token has left).
        #[arg(long)]
        ttl: Option<String>,
    },
    /// The tokens you may see (never their secrets).
    Ls,
    /// Revoke tokens by id (and every token each one issued).
    Revoke {
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

/// `sandboxes=2000,cpu=500,memory=2TiB,...` as the API's quota.
pub fn parse_quota(s: &str, overcommit: bool) -> anyhow::Result<api::QuotaSpec> {
    let mut q = api::QuotaSpec { overcommit, ..api::QuotaSpec::default() };
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item.split_once('=').ok_or_else(|| anyhow::anyhow!("quota item {item:?} must be name=value"))?;
        let int = || v.trim().parse::<i64>().map_err(|_| anyhow::anyhow!("quota {k}: {v:?} is not a whole number"));
        match k.trim() {
            "sandboxes" => q.sandboxes = Some(int()?),
            "cpu" => q.cpu = Some(v.trim().parse().map_err(|_| anyhow::anyhow!("quota cpu: {v:?} is not a number of cores"))?),
            "memory" | "memory_mb" => q.memory_mb = Some(mebibytes(v)?),
            "disk" | "disk_mb" => q.disk_mb = Some(mebibytes(v)?),
            "creations_per_s" => q.creations_per_s = Some(int()?),
            "fncall_per_s" => q.fncall_per_s = Some(int()?),
            other => anyhow::bail!("unknown quota limit {other:?}: sandboxes, cpu, memory, disk, creations_per_s, fncall_per_s"),
        }
    }
    Ok(q)
}

/// `512`, `512MiB`, `2GiB`, `2TiB` (also `M`, `G`, `T`) in MiB.
fn mebibytes(v: &str) -> anyhow::Result<i64> {
    let v = v.trim();
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '-')).unwrap_or(v.len());
    let (n, unit) = v.split_at(split);
    let n: i64 = n.parse().map_err(|_| anyhow::anyhow!("{v:?} is not a size (e.g. 512MiB, 2GiB, 2TiB)"))?;
    let factor = match unit.trim() {
        "" | "M" | "MiB" | "MB" => 1,
        "G" | "GiB" | "GB" => 1 << 10,
        "T" | "TiB" | "TB" => 1 << 20,
        other => anyhow::bail!("unknown size unit {other:?} in {v:?}: MiB, GiB or TiB"),
    };
    n.checked_mul(factor).ok_or_else(|| anyhow::anyhow!("{v:?} is too large"))
}

/// `90s`, `30m`, `24h`, `7d` (a bare number is seconds) in seconds.
pub fn parse_ttl(v: &str) -> anyhow::Result<i64> {
    let v = v.trim();
    let (n, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len()));
    let n: i64 = n.parse().map_err(|_| anyhow::anyhow!("ttl {v:?} is not a duration (e.g. 90s, 30m, 24h, 7d)"))?;
    let factor = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        other => anyhow::bail!("unknown ttl unit {other:?}: s, m, h or d"),
    };
    n.checked_mul(factor).ok_or_else(|| anyhow::anyhow!("ttl {v:?} is too long"))
}

fn limit_text(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v}"))
}

pub async fn project(a: ProjectArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    match a.cmd {
        ProjectCmd::Create { name, quota, overcommit } => {
            let quota = quota.map(|q| parse_quota(&q, overcommit)).transpose()?;
            let p = client.create_project(&name, quota).await?;
            println!("created project {}", p.name);
        }
        ProjectCmd::Ls => {
            println!("{:<40} {:<24} QUOTA", "PROJECT", "CREATED");
            for p in client.projects().await?.projects {
                let quota = p.quota.map(|q| serde_json::to_string(&q).unwrap_or_default()).unwrap_or_else(|| "-".into());
                println!("{:<40} {:<24} {quota}", p.name, p.created_at);
            }
        }
        ProjectCmd::Show { name } => {
            let p = client.project(&name).await?;
            println!("project   {}", p.name);
            println!("parent    {}", p.parent.as_deref().unwrap_or("-"));
            println!("created   {}", p.created_at);
            if p.overcommitted {
                println!("OVERCOMMITTED (given more than its parent's free share, or handing out more than it has)");
            }
            println!("{:<16} {:>14} {:>14} {:>14}", "LIMIT", "USED", "LIMIT", "TO CHILDREN");
            for u in p.usage {
                println!("{:<16} {:>14} {:>14} {:>14}", u.name, format!("{}", u.used), limit_text(u.limit), format!("{}", u.allocated));
            }
        }
        ProjectCmd::Quota { name, quota, overcommit, clear } => {
            let quota = if clear { None } else { quota.map(|q| parse_quota(&q, overcommit)).transpose()? };
            client.set_quota(&name, quota).await?;
            println!("quota of {name} {}", if clear { "removed" } else { "set" });
        }
        ProjectCmd::Rm { names } => {
            let mut failed = 0u8;
            for name in names {
                match client.delete_project(&name).await {
                    Ok(()) => println!("removed {name}"),
                    Err(e) => {
                        eprintln!("{name}: {e}");
                        failed = 1;
                    }
                }
            }
            return Ok(failed);
        }
    }
    Ok(0)
}

pub async fn token(a: TokenArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    match a.cmd {
        TokenCmd::Create { project, role, ttl } => {
            let ttl = ttl.map(|t| parse_ttl(&t)).transpose()?;
            let t = client.create_token(&project, role.as_deref(), ttl).await?;
            // The secret alone on stdout (shown this once); the rest on stderr.
            eprintln!("token {} for {} ({}), expires {}", t.id, t.project, t.role, t.expires_at.as_deref().unwrap_or("never"));
            println!("{}", t.token.unwrap_or_default());
        }
        TokenCmd::Ls => {
            println!("{:<18} {:<32} {:<8} {:<26} {:<26} ISSUER", "ID", "PROJECT", "ROLE", "EXPIRES", "REVOKED");
            for t in client.tokens().await?.tokens {
                println!(
                    "{:<18} {:<32} {:<8} {:<26} {:<26} {}",
                    t.id,
                    t.project,
                    t.role,
                    t.expires_at.as_deref().unwrap_or("-"),
                    t.revoked_at.as_deref().unwrap_or("-"),
                    t.issuer.as_deref().unwrap_or("-")
                );
            }
        }
        TokenCmd::Revoke { ids } => {
            let mut failed = 0u8;
            for id in ids {
                match client.revoke_token(&id).await {
                    Ok(()) => println!("revoked {id}"),
                    Err(e) => {
                        eprintln!("{id}: {e}");
                        failed = 1;
                    }
                }
            }
            return Ok(failed);
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_read_as_the_issue_writes_them() {
        let q = parse_quota("sandboxes=2000,cpu=500,memory=2TiB,disk=20TiB,creations_per_s=200,fncall_per_s=5000", false).unwrap();
        assert_eq!(q.sandboxes, Some(2000));
        assert_eq!(q.cpu, Some(500.0));
        assert_eq!(q.memory_mb, Some(2 << 20));
        assert_eq!(q.disk_mb, Some(20 << 20));
        assert_eq!((q.creations_per_s, q.fncall_per_s, q.overcommit), (Some(200), Some(5000), false));
        assert_eq!(parse_quota("memory=512", true).unwrap().memory_mb, Some(512));
        assert_eq!(parse_quota("sandboxes=-1", false).unwrap().sandboxes, Some(-1), "the server refuses it, with its message");
        assert!(parse_quota("gpus=1", false).is_err());
        assert!(parse_quota("memory=2XB", false).is_err());
        assert!(parse_quota("sandboxes", false).is_err());
    }

    #[test]
    fn ttls_take_units() {
        assert_eq!(parse_ttl("24h").unwrap(), 86_400);
        assert_eq!(parse_ttl("90").unwrap(), 90);
        assert_eq!(parse_ttl("7d").unwrap(), 7 * 86_400);
        assert!(parse_ttl("1w").is_err() && parse_ttl("h").is_err());
    }
}
