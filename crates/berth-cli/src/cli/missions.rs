//! The grammar of missions and what they leave: `mission`, `attempt`, `artifacts`.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum MissionCommand {
    /// Register a mission file and run it to completion, showing each step.
    Run {
        /// The mission file (TOML; `berth schema mission` prints its schema).
        file: std::path::PathBuf,
        /// Let `repository.path` name a directory outside the mission file's directory (by
        /// default a mission reads only what it ships with).
        #[arg(long)]
        allow_outside_path: bool,
    },
    /// Continue a mission after an interruption or crash.
    Resume {
        /// Mission id.
        id: String,
    },
    /// End a mission where it stands and remove the sandboxes its attempts hold (checkpoints
    /// and published evidence stay). A run driving it must be stopped first.
    Cancel {
        /// Mission id.
        id: String,
        /// Why, recorded with the mission (at most 500 characters, no control characters).
        #[arg(long, default_value = "cancelled with `berth mission cancel`")]
        reason: String,
    },
    /// Tasks, attempts, outcomes, reasons and timings of a mission.
    Status {
        /// Mission id.
        id: String,
    },
    /// Your missions.
    List,
    /// Follow a mission live: each agent attempt's normalized events as they arrive, and every
    /// attempt's outcome; ends when the mission does.
    Watch {
        /// Mission id.
        id: String,
        #[command(flatten)]
        watch: WatchArgs,
    },
    /// Measure the mission control plane: per-attempt overhead against the same provider
    /// operations done raw, and attempts per second at several concurrencies.
    Bench {
        /// Attempts per measurement.
        #[arg(long, default_value_t = 20)]
        attempts: usize,
        /// Concurrency levels for throughput.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
        concurrency: Vec<usize>,
    },
}

/// `berth attempt …`.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum AttemptCommand {
    /// An agent attempt's trajectory: Harbor's ATIF (v1.4), or Berth's normalized events.
    Trajectory {
        /// The attempt key (`berth mission status` lists them).
        key: String,
        /// `atif` (a JSON document) or `events` (JSON lines, `berth.events/v1`).
        #[arg(long, default_value = "atif", value_parser = ["atif", "events"])]
        format: String,
    },
    /// Keep an agent attempt's conversation as an agent session (`as-…`): `berth prompt ID
    /// --resume as-… --cwd repo "…"` then goes on with it in any sandbox.
    Session {
        /// The attempt key.
        key: String,
    },
    /// Follow an agent attempt's normalized events live (from the start; heartbeats while the
    /// agent is quiet); ends when the agent's run is over.
    Watch {
        /// The attempt key.
        key: String,
        #[command(flatten)]
        watch: WatchArgs,
    },
}

/// `berth artifacts …`.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ArtifactsCommand {
    /// Index rows by any coordinate (every option given must match).
    Query {
        #[command(flatten)]
        filter: ArtifactFilter,
    },
    /// Write the index rows (the same filters as `query`) as Apache Parquet to
    /// `DIR/artifacts.parquet`, replaced atomically.
    Export {
        /// The directory to write into (created if missing).
        #[arg(long, value_name = "DIR")]
        parquet: std::path::PathBuf,
        #[command(flatten)]
        filter: ArtifactFilter,
    },
    /// Bring the Iceberg table `berth.artifacts` up to date (append every indexed bundle it
    /// lacks) and read its rows back through the catalog (built with the `iceberg` feature).
    #[cfg(feature = "iceberg")]
    Iceberg,
    /// A bundle's manifest and publication state.
    Show {
        /// Bundle id (`bd-…`).
        bundle: String,
    },
    /// One file of an indexed bundle, its hash verified first (stdout, or `--out FILE`).
    Get {
        /// Bundle id.
        bundle: String,
        /// Path in the bundle.
        path: String,
        /// Write it to this new file (mode 0600) instead of stdout.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Finish interrupted publications whose objects are all present, expire those older
    /// than the retry window, and report objects no publication names.
    Reconcile {
        /// How long a publication missing objects waits for its mission to resume it.
        #[arg(long, default_value = "24h")]
        retry_window: String,
    },
}

// Which index rows (every option given must match). (Not a doc comment: see `EvidenceSource` in cli.rs.)
#[derive(Debug, Clone, clap::Args)]
pub struct ArtifactFilter {
    /// Mission id.
    #[arg(long)]
    pub mission: Option<String>,
    /// Task id.
    #[arg(long)]
    pub task: Option<String>,
    /// Attempt key.
    #[arg(long)]
    pub attempt: Option<String>,
    /// Bundle id.
    #[arg(long)]
    pub bundle: Option<String>,
    /// Accepted attempts only.
    #[arg(long, conflicts_with = "rejected")]
    pub accepted: bool,
    /// Rejected attempts only.
    #[arg(long)]
    pub rejected: bool,
    /// MIME type (`text/x-diff`, `application/x-ndjson`, …).
    #[arg(long)]
    pub mime: Option<String>,
    /// Path in the bundle (`patch.diff`, `logs/events.jsonl`, …).
    #[arg(long)]
    pub path: Option<String>,
}

// How a watcher reports silence. (Not a doc comment: see `EvidenceSource` in cli.rs.)
#[derive(Debug, Clone, clap::Args)]
pub struct WatchArgs {
    /// A heartbeat after this long without a new event (e.g. `5s`).
    #[arg(long, default_value = "5s")]
    pub heartbeat: String,
    /// Report the agent stalled after this long without output (e.g. `2m`).
    #[arg(long, default_value = "2m")]
    pub stall: String,
}
