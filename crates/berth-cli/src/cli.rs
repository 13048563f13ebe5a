//! Command-line grammar.

use clap::{Args, Parser, Subcommand};

mod interactive;
mod missions;
pub use interactive::{PortArgs, SshArgs, TokenCommand};
pub use missions::{ArtifactFilter, ArtifactsCommand, AttemptCommand, MissionCommand, WatchArgs};

const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    internal error (cleanup still ran)
  2    usage error
  3    not found
  4    unsupported: the provider does not support that capability
  5    invalid input (path, manifest, request)
  6    provider unavailable, at capacity, out of quota or rate-limited
  7    credentials missing or rejected
  8    conflict (state change in progress, name taken)
  9    timed out waiting for the provider
  10   cleanup incomplete: something is not verified gone
  11   refused: the resource is not provably yours
  12   verification failed: a conformance clause failed, or the catalog
       claims more than its evidence
  130  interrupted (SIGINT), 143 terminated (SIGTERM), after cleanup
  exec/run: the command's own exit code; 124 timed out; 128+N killed by
  signal N; 125 berth could not run it or its status is unknown

Environment:
  BERTH_HOME   state directory (default $XDG_DATA_HOME/berth)
  BERTH_OWNER  owner label on everything berth creates (default $USER@host)";

/// One honest interface to sandbox providers.
#[derive(Debug, Parser)]
#[command(name = "berth", version, about, after_long_help = EXIT_CODES)]
pub struct Cli {
    /// Print machine-readable JSON (schema `berth.cli/v1`) instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

// Every subcommand's arguments are built only when it is the one invoked (or help or completions
// need them): building the whole tree was ~0.3 ms of every `berth` process.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// List providers, their isolation and declared capabilities.
    Providers,
    /// Create a sandbox.
    #[command(alias = "new")]
    Create(CreateArgs),
    /// List your sandboxes (from the ledger, with their observed state).
    List(ListArgs),
    /// Show one sandbox: ledger entry and observed state.
    Status {
        /// Sandbox id (`bx-…`).
        id: String,
    },
    /// Run a command in a sandbox; exits with the command's exit code.
    Exec(ExecArgs),
    /// Processes started with `berth exec --detach` in a sandbox, with their status.
    Ps {
        /// Sandbox id.
        id: String,
    },
    /// What a detached process wrote (stdout, then stderr on stderr).
    Logs {
        /// Sandbox id.
        id: String,
        /// Process handle (from `exec --detach` or `berth ps`).
        handle: String,
        /// Keep printing new output until the process ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Kill a detached process and everything it started.
    Kill {
        /// Sandbox id.
        id: String,
        /// Process handle.
        handle: String,
    },
    /// An interactive terminal in a sandbox (also `connect`, `shell`): a shell, or `-- CMD…`;
    /// exits with its exit code.
    #[command(visible_aliases = ["connect", "shell"])]
    Ssh(SshArgs),
    /// Forward a port of a sandbox to this machine's loopback until interrupted; prints the
    /// local address. Works with network `none` (through the sandbox's supervisor).
    Port(PortArgs),
    /// Serve Berth's HTTP API (the same commands, as `berth.cli/v1` documents) behind bearer
    /// tokens; prints `listening on http://ADDR`, then serves until interrupted.
    Serve {
        /// Address to listen on (loopback by default; port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: std::net::SocketAddr,
        /// Also serve what isolates nothing: sandboxes of the `host` provider (a token with
        /// scope `exec` then runs commands as this server's own user, which reaches every
        /// owner's data and can make tokens of any scope) and network `host` (the server's
        /// loopback services) — for one trusted owner only.
        #[arg(long)]
        allow_unisolated: bool,
        /// The model endpoint `POST /v1/sandboxes/{id}/prompt` proxies to when a request brings
        /// no script (`https://api.anthropic.com`, `http://host:port`); its credential is the
        /// server's, never a caller's or a sandbox's.
        #[arg(long, requires = "prompt_credential_env")]
        prompt_proxy: Option<String>,
        /// The server's variable holding that endpoint's credential.
        #[arg(long, requires = "prompt_proxy")]
        prompt_credential_env: Option<String>,
    },
    /// API tokens for `berth serve`: create (printed once, stored hashed), list, revoke.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Copy a file into, out of or between sandboxes, streamed at any size: `berth cp ID:path
    /// local`, `berth cp local ID:path` or `berth cp ID:path ID2:path`.
    Cp {
        /// Source: `ID:path`, a local path, or `-` for stdin.
        source: String,
        /// Destination: `ID:path`, a local path, or `-` for stdout.
        destination: String,
    },
    /// List a directory of a sandbox, sorted by name: `berth ls ID` (its workspace) or
    /// `berth ls ID:path`. Symbolic links are shown, never followed.
    Ls {
        /// `ID` or `ID:path`.
        target: String,
    },
    /// Snapshot a sandbox's filesystem; prints the snapshot handle. The snapshot is a ledger
    /// row (its key is printed): `berth destroy KEY` deletes it.
    Snapshot {
        /// Sandbox id.
        id: String,
        /// Retention: after it, `berth gc` and `ledger sweep` delete the snapshot (default:
        /// kept until deleted).
        #[arg(long)]
        ttl: Option<String>,
    },
    /// Keep a sandbox's workspace as a checkpoint of Berth's own, restorable on any provider
    /// (`berth restore ws-… --provider P`); prints its id (`ws-…`, from its content).
    Checkpoint {
        /// Sandbox id.
        id: String,
        /// Retention: after it, `berth gc` deletes the checkpoint (default: kept until
        /// `berth destroy ws-…`).
        #[arg(long)]
        ttl: Option<String>,
    },
    /// This owner's stored checkpoints.
    Checkpoints,
    /// This owner's agent sessions (`berth prompt --resume as-…` goes on with one; `berth
    /// destroy as-…` deletes it).
    Sessions,
    /// Delete what nothing holds any more: sandboxes past their TTL, snapshots and checkpoints
    /// past their retention, sandboxes, snapshots and checkpoints a crash left half-made (intent rows whose call has
    /// shown no sign of life for 2 minutes) and what killed calls left that no row names,
    /// never what a running mission will adopt or an unexpired row of a run still live in
    /// another berth process. First it keeps the turns of killed `berth prompt` runs.
    Gc,
    /// Fork a sandbox into a new one.
    Fork {
        /// Sandbox id.
        id: String,
        #[command(flatten)]
        ttl: TtlArg,
    },
    /// Create a new sandbox from a snapshot handle, or from a checkpoint (`ws-…`) on any
    /// provider.
    Restore {
        /// Snapshot handle (e.g. `sha256:…`) or checkpoint id (`ws-…`).
        handle: String,
        /// Provider that holds the snapshot (for a checkpoint: the provider to restore on).
        #[arg(long, short, default_value = "host")]
        provider: String,
        /// For a checkpoint: the new sandbox's image, for providers that have them.
        #[arg(long)]
        image: Option<String>,
        #[command(flatten)]
        ttl: TtlArg,
    },
    /// Move a sandbox's workspace to a new sandbox on another provider: checkpoint, create,
    /// restore, verify, then destroy the source (kept whole if anything fails).
    Move(MoveArgs),
    /// Stop a sandbox cold (processes gone, filesystem kept), where the provider supports it.
    Stop {
        /// Sandbox id.
        id: String,
    },
    /// Start a stopped sandbox.
    Start {
        /// Sandbox id.
        id: String,
    },
    /// Suspend a sandbox with its memory, where the provider supports it.
    Suspend {
        /// Sandbox id.
        id: String,
    },
    /// Resume a suspended sandbox.
    Resume {
        /// Sandbox id.
        id: String,
    },
    /// Destroy sandboxes and verify they are gone; one that cannot be destroyed stops none of
    /// the others.
    Destroy {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Create a sandbox, run one command in it, destroy it.
    Run(RunArgs),
    /// The cleanup ledger.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// Walk through Berth's main job on the host provider: create, exec, copy, snapshot, fork,
    /// destroy, ledger.
    Demo,
    /// Measure a provider against its raw substrate.
    Bench(BenchArgs),
    /// Run the conformance suite and a short lifecycle measurement against a live provider and
    /// write an evidence record.
    Verify(VerifyArgs),
    /// The catalog: every provider's capabilities and what the evidence says about them.
    #[command(subcommand)]
    Catalog(CatalogCommand),
    /// Missions: coding-agent work as durable, validator-gated mission → task → attempt runs.
    #[command(subcommand)]
    Mission(MissionCommand),
    /// Provider development: `berth provider new NAME` scaffolds an adapter.
    #[command(subcommand)]
    Provider(ProviderCommand),
    /// Run an agent CLI in an existing sandbox against Berth's model gateway and stream its
    /// normalized events: `berth prompt ID --harness claude-code --script model.toml "…"`.
    Prompt(PromptArgs),
    /// One attempt of a mission: its agent trajectory.
    #[command(subcommand)]
    Attempt(AttemptCommand),
    /// The attempts' published artifact bundles: query the index, show a manifest, get a
    /// file (hash-verified), reconcile interrupted publications.
    #[command(subcommand)]
    Artifacts(ArtifactsCommand),
    /// Run the model gateway on its own: a scripted model (`--script FILE`) or a proxy to a
    /// real endpoint (`--proxy URL --credential-env VAR`), on 127.0.0.1, until interrupted.
    Gateway(GatewayArgs),
    /// Print a shell completion script: `berth completions bash > /etc/bash_completion.d/berth`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print a published JSON Schema.
    Schema {
        /// Which schema.
        #[arg(value_parser = ["manifest", "evidence", "mission", "events", "bundle", "openapi"])]
        which: String,
    },
}

#[derive(Debug, Args)]
pub struct TtlArg {
    /// Expiry label for what is created (e.g. `30m`, `24h`, `7d`).
    #[arg(long, default_value = "24h")]
    pub ttl: String,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Provider to create on.
    #[arg(long, short, default_value = "host")]
    pub provider: String,
    /// Providers to try next, in order, if the first is unavailable, at capacity or out of quota.
    #[arg(long, value_delimiter = ',')]
    pub fallback: Vec<String>,
    #[command(flatten)]
    pub shape: ShapeArgs,
}

// What a new sandbox is made with (`create`, and the target of `move`). A plain comment: the
// doc comment of flattened arguments becomes the about text of the commands that take them.
#[derive(Debug, Args)]
pub struct ShapeArgs {
    /// Image or template, for providers that have them.
    #[arg(long)]
    pub image: Option<String>,
    #[command(flatten)]
    pub network: NetworkArg,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub ttl: TtlArg,
}

#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The sandbox to move.
    pub id: String,
    /// Provider to move to.
    #[arg(long)]
    pub to: String,
    // The new sandbox's image, network, limits and expiry.
    #[command(flatten)]
    pub shape: ShapeArgs,
}

#[derive(Debug, Args)]
pub struct LimitArgs {
    /// CPU limit (fractional allowed), where the provider enforces limits.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Memory limit in MiB.
    #[arg(long)]
    pub memory_mib: Option<u64>,
    /// Maximum number of processes.
    #[arg(long)]
    pub pids: Option<u64>,
}

impl LimitArgs {
    pub fn resources(&self) -> berth_contract::Resources {
        berth_contract::Resources {
            cpus: self.cpus,
            memory_mib: self.memory_mib,
            pids: self.pids,
        }
    }
}

#[derive(Debug, Args)]
pub struct NetworkArg {
    /// Network access: `none` (default; loopback only where the provider can enforce it),
    /// `bridge` (outbound through a network of the sandbox's own) or `host` (the host's own
    /// network, loopback services included: no network isolation).
    #[arg(long, default_value = "none", value_parser = ["none", "bridge", "host"])]
    pub network: String,
}

impl NetworkArg {
    pub fn mode(&self) -> berth_contract::NetworkMode {
        match self.network.as_str() {
            "bridge" => berth_contract::NetworkMode::Bridge,
            "host" => berth_contract::NetworkMode::Host,
            _ => berth_contract::NetworkMode::None,
        }
    }
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Include sandboxes already verified gone.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct CommandSpec {
    /// Deadline (e.g. `500ms`, `30s`, `5m`); on expiry the whole process tree is killed.
    #[arg(long)]
    pub timeout: Option<String>,
    /// Environment for the command: `NAME` passes your value without putting it in argv;
    /// `NAME=VALUE` sets it (visible in your shell history and process list).
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Run this line with `sh -c` instead of an argument vector.
    #[arg(long = "shell", short = 'c', conflicts_with = "argv")]
    pub shell: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(last = true)]
    pub argv: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Sandbox id.
    pub id: String,
    /// Start the command in the background and print its process handle (`berth ps`, `berth
    /// logs`, `berth kill` take it), where the provider supports detached exec.
    #[arg(long, short = 'd', conflicts_with = "timeout")]
    pub detach: bool,
    #[command(flatten)]
    pub spec: CommandSpec,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Provider to run on.
    #[arg(long, short, default_value = "host")]
    pub provider: String,
    /// Keep the sandbox afterwards instead of destroying it.
    #[arg(long)]
    pub keep: bool,
    /// Image or template, for providers that have them.
    #[arg(long)]
    pub image: Option<String>,
    #[command(flatten)]
    pub network: NetworkArg,
    #[command(flatten)]
    pub spec: CommandSpec,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum LedgerCommand {
    /// Show ledger entries (open ones unless `--all`).
    List {
        /// Include verified-gone entries.
        #[arg(long)]
        all: bool,
    },
    /// Destroy and verify everything this owner created that is not verified gone, except what
    /// a running mission, a run still live in another berth process (until its expiry) or a
    /// snapshot's retention holds (reported as held).
    Sweep {
        /// Only this run's resources.
        #[arg(long)]
        run: Option<String>,
        /// Only resources whose expiry has passed.
        #[arg(long)]
        expired: bool,
        /// Do not list providers for labelled resources missing from the ledger.
        #[arg(long)]
        no_discover: bool,
    },
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Providers to measure, side by side (with `--raw`, exactly one); `gateway` measures the
    /// model gateway and the agent CLIs' start-up instead; `monitor P…` the latency from a
    /// line an agent writes in a sandbox of P to the normalized event at a watcher; `bridge
    /// [VENDOR]` the ComputeSDK bridge against the same ComputeSDK provider driven from Node
    /// (default just-bash); `move FROM TO` a move against the same steps without its checks;
    /// `resume P [HARNESS]` an agent's turn going on with its conversation in another sandbox
    /// against a fresh turn.
    #[arg(required = true)]
    pub providers: Vec<String>,
    /// Compare one provider's exec and create→destroy cycle with its raw substrate instead.
    #[arg(long)]
    pub raw: bool,
    /// Iterations per provider (with `--raw`: samples per measurement).
    #[arg(long)]
    pub iterations: Option<usize>,
    /// Image for providers that need one (docker).
    #[arg(long)]
    pub image: Option<String>,
    /// Lifecycle mode: one at a time, all at once, or launched every `--stagger-ms`.
    #[arg(long, default_value = "sequential", value_parser = ["sequential", "burst", "staggered"])]
    pub mode: String,
    /// How many run at once in burst and staggered modes.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Delay between launches in staggered mode.
    #[arg(long, default_value_t = 200)]
    pub stagger_ms: u64,
    /// Also write the results JSON (ComputeSDK-compatible shape) to this file.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// How long `bench serve`'s load runs (default 30s; `--concurrency` clients).
    #[arg(long)]
    pub duration: Option<String>,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Provider to verify.
    pub provider: String,
    /// Image for providers that need one (docker).
    #[arg(long)]
    pub image: Option<String>,
    /// Directory for the evidence record (default `$BERTH_HOME/evidence`).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// Lifecycle iterations (create → first exec → destroy).
    #[arg(long, default_value_t = 5)]
    pub iterations: usize,
    /// Sign the record with this private key (from `berth catalog keygen`). Unsigned records
    /// are UNKNOWN to the gate.
    #[arg(long)]
    pub sign_key: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum CatalogCommand {
    /// Show each provider's capabilities as VERIFIED / FAILED / UNKNOWN / UNSUPPORTED, with the
    /// evidence record behind them.
    Show {
        /// Only this provider.
        provider: Option<String>,
        #[command(flatten)]
        source: EvidenceSource,
    },
    /// Fail when any manifest claims more than its evidence shows: a failing clause, a claimed
    /// verification without proof, or — for adapters in this build — a capability declared
    /// supported that is not VERIFIED.
    Check {
        #[command(flatten)]
        source: EvidenceSource,
    },
    /// Make an ed25519 key pair for signing evidence (`berth verify --sign-key FILE`): FILE
    /// (the private seed, mode 0600, never printed) and FILE.pub.
    Keygen {
        /// Where the private key goes; it must not exist yet.
        file: std::path::PathBuf,
    },
}

// Where catalog commands read manifests and evidence from, and whom they trust. (Not a doc
// comment: on a flattened `Args` struct it would replace its command's about.)
#[derive(Debug, Args)]
pub struct EvidenceSource {
    /// Read manifests from this directory instead of the ones built in.
    #[arg(long)]
    pub catalog: Option<std::path::PathBuf>,
    /// Read evidence records only from this directory (it must exist). Default: each
    /// provider's record in `$BERTH_HOME/evidence` if there is one, else the record shipped
    /// with this build (`catalog/evidence/`).
    #[arg(long)]
    pub evidence: Option<std::path::PathBuf>,
    /// Also trust signatures by this public key (a `.pub` file from `catalog keygen`);
    /// repeatable. The keys shipped in `catalog/keys/` are always trusted.
    #[arg(long = "trust-key")]
    pub trust_keys: Vec<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ProviderCommand {
    /// Generate a compiling adapter crate, its manifest (status UNKNOWN), conformance wiring and
    /// the contribution checklist.
    New {
        /// Provider id: lowercase letters, digits and `-`.
        name: String,
        /// The Berth checkout to write into (default: the current directory).
        #[arg(long, default_value = ".")]
        root: std::path::PathBuf,
        /// Where Berth's crates live, when `--root` is not a Berth checkout (the generated crate
        /// then gets its own workspace and path dependencies).
        #[arg(long)]
        berth_source: Option<std::path::PathBuf>,
    },
}

// `berth gateway`'s arguments. (Not a doc comment: see EvidenceSource.)
#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    /// A model script (TOML; see the README's "Model gateway" section).
    #[arg(long, conflicts_with = "proxy", required_unless_present = "proxy")]
    pub script: Option<std::path::PathBuf>,
    /// Forward to this origin (`https://api.anthropic.com`, `http://host:port`) instead, adding
    /// the credential (https: the system's roots, plus `BERTH_PROXY_CA_FILE` when set).
    #[arg(long, requires = "credential_env")]
    pub proxy: Option<String>,
    /// The environment variable holding the proxy's credential (the value never goes in argv).
    #[arg(long)]
    pub credential_env: Option<String>,
    /// The port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// The attempt name journal lines carry.
    #[arg(long, default_value = "gateway")]
    pub attempt: String,
    /// Where requests are journaled (default: under `$BERTH_HOME/state/gateway/`).
    #[arg(long)]
    pub journal: Option<std::path::PathBuf>,
    /// A price table (TOML: `[models."NAME"] input = …, output = …, cached_input = …`, US
    /// dollars per million tokens) for the journal's costs.
    #[arg(long)]
    pub prices: Option<std::path::PathBuf>,
}

// `berth prompt`'s arguments. (Not a doc comment: see EvidenceSource.)
#[derive(Debug, clap::Args)]
pub struct PromptArgs {
    /// The sandbox.
    pub id: String,
    /// The agent CLI (a resumed session's own by default).
    #[arg(long, value_parser = ["opencode", "codex", "claude-code"], required_unless_present = "resume")]
    pub harness: Option<String>,
    /// What the agent is asked to do.
    pub instructions: String,
    /// Go on with an agent session (`as-…`, printed by an earlier `berth prompt`) in this
    /// sandbox, whichever sandbox or provider its last turn ran in.
    #[arg(long, value_name = "SESSION")]
    pub resume: Option<String>,
    /// A scripted model (TOML).
    #[arg(long, conflicts_with = "proxy", required_unless_present = "proxy")]
    pub script: Option<std::path::PathBuf>,
    /// A real endpoint's origin (`http://host:port`); the gateway adds the credential.
    #[arg(long, requires = "credential_env")]
    pub proxy: Option<String>,
    /// The variable holding the proxy's credential (its value never enters the sandbox).
    #[arg(long)]
    pub credential_env: Option<String>,
    /// The model name the CLI asks for.
    #[arg(long, default_value = "scripted")]
    pub model: String,
    /// The working directory in the sandbox (relative to its workspace).
    #[arg(long, default_value = ".")]
    pub cwd: String,
    /// Deadline for the agent.
    #[arg(long, default_value = "10m")]
    pub timeout: String,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Deferred arguments are built after a subcommand's own settings, so a doc comment on an
    /// `Args` struct would replace the about its parent lists: every subcommand's help must open
    /// with what its parent's help lists for it, as a user sees both.
    #[test]
    fn deferred_subcommands_keep_the_about_their_parent_lists() {
        fn help(path: &[&str]) -> String {
            let argv = std::iter::once("berth").chain(path.iter().copied());
            let err = Cli::command()
                .try_get_matches_from(argv.chain(["--help"]))
                .expect_err("--help ends parsing");
            assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp, "{path:?}");
            err.to_string()
        }
        fn words(text: &str) -> Vec<&str> {
            text.split_whitespace().take(4).collect()
        }
        fn check(parent: &clap::Command, path: &[&str], seen: &mut usize) {
            let parent_help = help(path);
            for sub in parent.get_subcommands().filter(|s| s.get_name() != "help") {
                let mut sub_path = path.to_vec();
                sub_path.push(sub.get_name());
                let listed = parent_help
                    .lines()
                    .find_map(|line| {
                        line.strip_prefix("  ")?
                            .strip_prefix(sub.get_name())?
                            .strip_prefix(' ')
                            .map(str::trim)
                    })
                    .unwrap_or_else(|| panic!("{sub_path:?} not listed in:\n{parent_help}"));
                let own = help(&sub_path);
                let opening = own.lines().next().unwrap_or_default();
                assert_eq!(
                    words(listed),
                    words(opening),
                    "{sub_path:?}: listed as {listed:?}, its help opens {opening:?}"
                );
                *seen += 1;
                check(sub, &sub_path, seen);
            }
        }
        let mut tree = Cli::command();
        tree.build();
        let mut seen = 0;
        check(&tree, &[], &mut seen);
        assert!(seen > 40, "only {seen} subcommands were checked");
    }

    /// clap's own consistency checks, over the whole tree with every deferred part built.
    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }
}
