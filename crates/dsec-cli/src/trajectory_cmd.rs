//! `dsec trajectory` (provenance) and `dsec replay`.

use clap::Args;

use crate::connect::ConnectArgs;

#[derive(Args, Debug)]
pub struct TrajectoryArgs {
    pub id: String,
    /// Print the log as JSON (the API's answer) instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    pub id: String,
    /// Keep the replay sandbox running afterwards (default: remove it).
    #[arg(long)]
    pub keep: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// Exit status of a replay whose results diverged (1 is for errors).
const DIVERGED: u8 = 2;

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
    if flat.chars().count() > max {
        format!("{}...", flat.chars().take(max).collect::<String>())
    } else {
        flat
    }
}

/// What a step did, in a few words.
fn summary(step: &dsec_api::TrajectoryStep) -> String {
    let op = &step.operation;
    let spec = &op["spec"];
    match step.kind.as_str() {
        "exec" => match (&spec["command"]["Shell"], &spec["command"]["Argv"]) {
            (serde_json::Value::String(s), _) => s.clone(),
            (_, serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_str()).collect::<Vec<_>>().join(" "),
            _ => String::new(),
        },
        "write_file" => format!("{} ({} bytes)", spec["path"].as_str().unwrap_or(""), op["bytes"]),
        "extract_archive" => format!("{} ({} bytes of tar)", op["path"].as_str().unwrap_or(""), op["bytes"]),
        "mkdir" | "remove" => op["path"].as_str().unwrap_or("").to_string(),
        "close_session" => op["session_id"].as_str().unwrap_or("").to_string(),
        _ => String::new(),
    }
}

fn outcome(step: &dsec_api::TrajectoryStep) -> String {
    if let Some(e) = &step.error {
        return format!("error {}", e.code);
    }
    match (&step.result, step.kind.as_str()) {
        (Some(r), "exec") => format!("exit {}", r["exit_code"]),
        (Some(_), _) => "ok".into(),
        (None, _) => step.status.clone(),
    }
}

pub async fn show(a: TrajectoryArgs) -> anyhow::Result<u8> {
    let t = a.conn.client()?.trajectory(&a.id).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&t)?);
        return Ok(0);
    }
    println!("{:>4}  {:<14} {:<16} {:<10} OPERATION", "SEQ", "STEP", "KIND", "RESULT");
    for s in &t.steps {
        println!(
            "{:>4}  {:<14} {:<16} {:<10} {}",
            s.seq,
            one_line(s.step_id.as_deref().unwrap_or("-"), 14),
            s.kind,
            outcome(s),
            one_line(&summary(s), 60)
        );
        for f in s.changed_files.iter().flatten() {
            println!("{:>6}{} {}", "", if f.change == "deleted" { "-" } else { "~" }, f.path);
        }
        if s.changed_truncated {
            println!("{:>6}... (more files changed)", "");
        }
    }
    Ok(0)
}

pub async fn replay(a: ReplayArgs) -> anyhow::Result<u8> {
    let r = a.conn.client()?.replay(&a.id, a.keep).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let kept = if r.kept { format!(" (kept: {})", r.replay_id) } else { String::new() };
        println!("replayed {} of {} steps of {} in {}{kept}", r.replayed, r.steps, r.source_id, r.replay_id);
        for d in &r.divergences {
            let step = d.step_id.as_deref().map(|s| format!(" [{s}]")).unwrap_or_default();
            println!("step {}{step} {}: {} differs", d.seq, d.kind, d.field);
            println!("  recorded: {}", one_line(&d.recorded, 200));
            println!("  replayed: {}", one_line(&d.replayed, 200));
        }
        println!("{}", if r.identical { "identical" } else { "diverged" });
    }
    Ok(if r.identical { 0 } else { DIVERGED })
}
