//! Finding the platform: `DSEC_ENDPOINT` and `DSEC_TOKEN`, falling back to
//! the local defaults of `dsec up` (loopback, and the admin token file when
//! this user can read it).

use clap::Args;
use dsec_client::Client;

#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// API endpoint, or several apiserver replicas separated by commas
    /// (a request that cannot reach one goes to the next where that is safe).
    #[arg(long, env = "DSEC_ENDPOINT", default_value = "http://127.0.0.1:8080", global = true)]
    pub endpoint: String,
    /// The CA an https:// endpoint's certificate must chain to (PEM: the
    /// cluster CA of `dsec cluster init`); default: the public web's roots.
    #[arg(long, env = "DSEC_CA_CERT", global = true)]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Bearer token; default: $DSEC_TOKEN, else the local admin token file.
    #[arg(long, env = "DSEC_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
}

impl ConnectArgs {
    pub fn client(&self) -> anyhow::Result<Client> {
        let token = self.token.clone().or_else(|| {
            let file = std::env::var_os("DSEC_TOKEN_FILE")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| crate::default_data_dir().join("admin-token"));
            std::fs::read_to_string(file).ok().map(|t| t.trim().to_string())
        });
        Ok(Client::with_ca(&self.endpoint, token.as_deref(), self.ca_cert.as_deref())?)
    }
}
