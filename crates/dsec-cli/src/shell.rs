//! `dsec shell ID`: an interactive terminal in a sandbox, over the PTY
//! WebSocket, with the local terminal in raw mode.

use std::io::{Read, Write};

use clap::Args;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::connect::ConnectArgs;

/// A byte stream a WebSocket runs over: TCP, or TLS over TCP.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Opens the WebSocket of `req` (`ws://` or `wss://`; the latter checked
/// against the client's CA, as its HTTP requests are).
async fn open_ws(
    client: &dsec_client::Client,
    req: tokio_tungstenite::tungstenite::handshake::client::Request,
) -> anyhow::Result<tokio_tungstenite::WebSocketStream<Box<dyn Io>>> {
    let uri = req.uri();
    let host = uri.host().ok_or_else(|| anyhow::anyhow!("WebSocket URL {uri} has no host"))?.to_string();
    let secure = uri.scheme_str() == Some("wss");
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let stream: Box<dyn Io> = if secure {
        Box::new(dsec_tls::connect(client.tls_config(), &host, port).await?)
    } else {
        let tcp = tokio::net::TcpStream::connect((host.trim_start_matches('[').trim_end_matches(']'), port)).await?;
        tcp.set_nodelay(true)?;
        Box::new(tcp)
    };
    Ok(tokio_tungstenite::client_async(req, stream).await?.0)
}

#[derive(Args, Debug)]
pub struct ShellArgs {
    pub id: String,
    /// Run this instead of the user's shell.
    #[arg(long)]
    pub cmd: Option<String>,
    #[arg(long)]
    pub user: Option<String>,
    #[command(flatten)]
    pub conn: ConnectArgs,
}

/// Puts the terminal in raw mode and restores it when dropped.
struct RawMode(Option<libc::termios>);

impl RawMode {
    fn enter() -> RawMode {
        // SAFETY: termios is plain data; tcgetattr/tcsetattr on fd 0 with
        // valid pointers. Not a terminal: nothing to change.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::isatty(0) == 0 || libc::tcgetattr(0, &mut t) != 0 {
                return RawMode(None);
            }
            let saved = t;
            libc::cfmakeraw(&mut t);
            libc::tcsetattr(0, libc::TCSANOW, &t);
            RawMode(Some(saved))
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            // SAFETY: restores the attributes saved in enter().
            unsafe { libc::tcsetattr(0, libc::TCSANOW, t) };
        }
    }
}

fn window_size() -> (u16, u16) {
    // SAFETY: TIOCGWINSZ fills a winsize struct.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_row > 0 {
            (ws.ws_row, ws.ws_col)
        } else {
            (24, 80)
        }
    }
}

pub async fn run(a: ShellArgs) -> anyhow::Result<u8> {
    let client = a.conn.client()?;
    let (rows, cols) = window_size();
    let mut path = format!("/v1/sandboxes/{}/pty?rows={rows}&cols={cols}", a.id);
    if let Some(c) = &a.cmd {
        path.push_str(&format!("&cmd={}", pct(c)));
    }
    if let Some(u) = &a.user {
        path.push_str(&format!("&user={}", pct(u)));
    }
    // Fail with a clear message (404, 401, not running) before touching
    // the terminal.
    let sb = client.get(&a.id).await?;
    if sb.state != dsec_api::SandboxState::Running {
        anyhow::bail!("sandbox_not_running: sandbox {} is {}, not running", sb.id, sb.state.as_str());
    }
    let mut req = client.ws_url(&path).into_client_request()?;
    if let Some(h) = client.auth_header() {
        req.headers_mut().insert("authorization", h.parse()?);
    }
    let ws = open_ws(&client, req).await?;
    let (mut tx, mut rx) = ws.split();
    let _raw = RawMode::enter();

    let (in_tx, mut in_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut stdin = std::io::stdin();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 || in_tx.blocking_send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let mut code = 0u8;
    loop {
        tokio::select! {
            Some(input) = in_rx.recv() => { tx.send(Message::Binary(input.into())).await?; }
            _ = winch.recv() => {
                let (rows, cols) = window_size();
                let msg = serde_json::json!({"type": "resize", "rows": rows, "cols": cols}).to_string();
                tx.send(Message::Text(msg.into())).await?;
            }
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    let mut out = std::io::stdout();
                    out.write_all(&b)?;
                    out.flush()?;
                }
                Some(Ok(Message::Text(t))) => {
                    let v: serde_json::Value = serde_json::from_str(&t).unwrap_or_default();
                    if v["type"] == "exit" {
                        code = v["exit_code"].as_i64().unwrap_or(0).clamp(0, 255) as u8;
                    } else if v["type"] == "error" {
                        drop(_raw);
                        anyhow::bail!("{}: {}", v["code"].as_str().unwrap_or("error"), v["message"].as_str().unwrap_or(""));
                    }
                }
                Some(Ok(_)) => {}
                None | Some(Err(_)) => break,
            }
        }
    }
    Ok(code)
}

fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}
