//! The grammar of the interactive and service verbs: `ssh`, `port`, `token`.

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token for one owner with one scope; prints it once.
    Create {
        /// The owner whose sandboxes, missions and ledger the token reaches.
        #[arg(long)]
        owner: String,
        /// `read` (list, show, events), `exec` (also create, exec, destroy) or `admin` (also
        /// the audit log).
        #[arg(long, value_parser = ["read", "exec", "admin"])]
        scope: String,
        /// A label for people.
        #[arg(long, default_value = "")]
        name: String,
    },
    /// Every token: id, owner, scope, live or revoked (never the token).
    List,
    /// Revoke a token: it answers 401 from then on.
    Revoke {
        /// Token id (`tk-…`).
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct SshArgs {
    /// Sandbox id.
    pub id: String,
    /// Command to run instead of a shell.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct PortArgs {
    /// Sandbox id.
    pub id: String,
    /// The port inside the sandbox (its own `127.0.0.1`).
    pub port: u16,
    /// Where to answer on this machine (loopback only; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub local: std::net::SocketAddr,
}
